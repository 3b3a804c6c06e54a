// The layer-wise engine's kernels on a CUDA device (everything but the matrix products,
// which are cuBLAS). Compiled at start by NVRTC (no headers); each kernel is the twin of the
// CPU kernel of the same name in trainer/src/kernels.rs, one thread per output value, in a
// grid-stride loop; no thread depends on another (a test runs them on the CPU, compiled as
// C++, against the CPU kernels). Sizes are size_t; row-major f32 buffers; NHWC images.

#define FOR_EACH(i, n)                                                              \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);         \
         i += (size_t)blockDim.x * gridDim.x)

// x[r, j] += bias[j] for x of n values in rows of `cols`.
extern "C" __global__ void add_bias(float* x, const float* bias, size_t n, size_t cols) {
    FOR_EACH(i, n) { x[i] += bias[i % cols]; }
}

// x = max(x, 0).
extern "C" __global__ void relu(float* x, size_t n) {
    FOR_EACH(i, n) { x[i] = fmaxf(x[i], 0.0f); }
}

// g = 0 where the ReLU's output was not positive.
extern "C" __global__ void relu_backward(float* g, const float* out, size_t n) {
    FOR_EACH(i, n) {
        if (out[i] <= 0.0f) {
            g[i] = 0.0f;
        }
    }
}

// x = 0.
extern "C" __global__ void fill_zero(float* x, size_t n) {
    FOR_EACH(i, n) { x[i] = 0.0f; }
}

// Column sums in two passes (no thread waits for another, so every kernel here is a set of
// independent threads): part[q, j] = sum of x[r, j] over the rows r of chunk q
// (chunk_rows rows each), then dst[j] = sum over q of part[q, j].
extern "C" __global__ void column_partials(const float* x, float* part, size_t rows,
                                           size_t cols, size_t chunk_rows) {
    size_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    FOR_EACH(i, chunks * cols) {
        size_t q = i / cols, j = i % cols;
        size_t end = (q + 1) * chunk_rows < rows ? (q + 1) * chunk_rows : rows;
        float s = 0.0f;
        for (size_t r = q * chunk_rows; r < end; r++) {
            s += x[r * cols + j];
        }
        part[i] = s;
    }
}

extern "C" __global__ void column_finish(const float* part, float* dst, size_t chunks,
                                         size_t cols) {
    FOR_EACH(j, cols) {
        float s = 0.0f;
        for (size_t q = 0; q < chunks; q++) {
            s += part[q * cols + j];
        }
        dst[j] = s;
    }
}

// cols[(b, y, x), (ky, kx, c)] for a stride-1 k x k "same" convolution (padding k / 2).
extern "C" __global__ void im2col(const float* x, float* cols, size_t b, size_t h, size_t w,
                                  size_t c, size_t k) {
    size_t p = k / 2, row_len = k * k * c, n = b * h * w * row_len;
    FOR_EACH(i, n) {
        size_t row = i / row_len, rem = i % row_len;
        size_t ky = rem / (k * c), kx = (rem / c) % k, ch = rem % c;
        size_t img = row / (h * w), y = (row / w) % h, xx = row % w;
        long long iy = (long long)(y + ky) - (long long)p;
        long long ix = (long long)(xx + kx) - (long long)p;
        float v = 0.0f;
        if (iy >= 0 && iy < (long long)h && ix >= 0 && ix < (long long)w) {
            v = x[((img * h + (size_t)iy) * w + (size_t)ix) * c + ch];
        }
        cols[i] = v;
    }
}

// The adjoint of im2col, gathering: each input value sums the column entries it fed.
extern "C" __global__ void col2im(const float* dcols, float* dx, size_t b, size_t h, size_t w,
                                  size_t c, size_t k) {
    size_t p = k / 2, row_len = k * k * c, n = b * h * w * c;
    FOR_EACH(i, n) {
        size_t ch = i % c, ix = (i / c) % w, iy = (i / (c * w)) % h, img = i / (c * w * h);
        float s = 0.0f;
        for (size_t ky = 0; ky < k; ky++) {
            long long y = (long long)(iy + p) - (long long)ky;
            if (y < 0 || y >= (long long)h) {
                continue;
            }
            for (size_t kx = 0; kx < k; kx++) {
                long long xx = (long long)(ix + p) - (long long)kx;
                if (xx < 0 || xx >= (long long)w) {
                    continue;
                }
                size_t row = (img * h + (size_t)y) * w + (size_t)xx;
                s += dcols[row * row_len + (ky * k + kx) * c + ch];
            }
        }
        dx[i] = s;
    }
}

// 2x2 stride-2 max-pooling of [b, h, w, c] into [b, h/2, w/2, c]; arg: index of the maximum
// in x (the first on ties, in the order (0,0), (0,1), (1,0), (1,1)).
extern "C" __global__ void max_pool2(const float* x, float* out, unsigned int* arg, size_t b,
                                     size_t h, size_t w, size_t c) {
    size_t oh = h / 2, ow = w / 2, n = b * oh * ow * c;
    FOR_EACH(o, n) {
        size_t ch = o % c, ox = (o / c) % ow, oy = (o / (c * ow)) % oh, img = o / (c * ow * oh);
        size_t base = ((img * h + 2 * oy) * w + 2 * ox) * c + ch;
        size_t offsets[3] = {c, w * c, w * c + c};
        size_t best = base;
        for (int t = 0; t < 3; t++) {
            if (x[base + offsets[t]] > x[best]) {
                best = base + offsets[t];
            }
        }
        out[o] = x[best];
        arg[o] = (unsigned int)best;
    }
}

// dx[arg[o]] += dout[o] (dx zeroed before; the pooling windows do not overlap, so no two
// outputs share a maximum).
extern "C" __global__ void max_pool2_backward(const float* dout, const unsigned int* arg,
                                              float* dx, size_t n) {
    FOR_EACH(o, n) { dx[arg[o]] += dout[o]; }
}

// out[o, j, i] = x[o, i, j] for x of shape [outer, rows, cols]: the layout transposes of
// images (NHWC <-> NCHW, rows and cols = pixels and channels) and of convolution weights
// ([oc, c, taps] <-> [oc, taps, c]).
extern "C" __global__ void batched_transpose(const float* x, float* out, size_t outer,
                                             size_t rows, size_t cols) {
    size_t per = rows * cols, n = outer * per;
    FOR_EACH(i, n) {
        size_t o = i / per, r = (i % per) / cols, c = i % cols;
        out[o * per + c * rows + r] = x[i];
    }
}

// Per row: softmax cross-entropy of logits[r] against labels[r] into row_loss[r], and its
// gradient (softmax - onehot) / rows into dlogits. A label out of range gives a NaN loss.
extern "C" __global__ void softmax_xent(const float* logits, const unsigned int* labels,
                                        float* dlogits, float* row_loss, size_t rows,
                                        size_t classes) {
    FOR_EACH(r, rows) {
        const float* z = logits + r * classes;
        float* d = dlogits + r * classes;
        float mx = __int_as_float(0xff800000);
        for (size_t j = 0; j < classes; j++) {
            mx = fmaxf(mx, z[j]);
        }
        float sum = 0.0f;
        for (size_t j = 0; j < classes; j++) {
            d[j] = expf(z[j] - mx);
            sum += d[j];
        }
        unsigned int y = labels[r];
        float n = (float)rows;
        for (size_t j = 0; j < classes; j++) {
            d[j] /= sum * n;
        }
        if (y < classes) {
            row_loss[r] = logf(sum) - (z[y] - mx);
            d[y] -= 1.0f / n;
        } else {
            row_loss[r] = __int_as_float(0x7fffffff);
        }
    }
}

// The optimizer on the device, the twins of crate::optimizer's updates (a rank whose
// gradients are averaged by NCCL keeps its parameters and optimizer state in device memory).
// SGD with momentum, PyTorch's semantics: b = mu*b + (g + wd*p); p -= lr*b.
extern "C" __global__ void sgd_update(float* p, const float* g, float* b, size_t n, float lr,
                                      float mu, float wd) {
    FOR_EACH(i, n) {
        float v = mu * b[i] + (g[i] + wd * p[i]);
        b[i] = v;
        p[i] -= lr * v;
    }
}

// AdamW: m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr*((m/c1)/(sqrt(v/c2)+eps) + wd*p),
// with the bias corrections c1 = 1-b1^t, c2 = 1-b2^t computed on the host.
extern "C" __global__ void adamw_update(float* p, const float* g, float* m, float* v, size_t n,
                                        float lr, float b1, float b2, float eps, float wd,
                                        float c1, float c2) {
    FOR_EACH(i, n) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float update = (mi / c1) / (sqrtf(vi / c2) + eps);
        p[i] -= lr * (update + wd * p[i]);
    }
}
