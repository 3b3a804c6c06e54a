# Sourced by bench-train.sh and bench-gpu.sh: the benchmark models' train specs.
#
#   bench_spec MODEL FILE [COMPRESSION] [FACTORS] [BATCH]
#
# writes the spec of MODEL (mlp: 784-1024-1024-10; cnn: channels 16, 32, kernel 3, fc 128)
# on synthetic 28×28 images, SGD lr 0.01, BATCH samples per worker (default 64), to FILE.
bench_spec() {
    local model=$1 f=$2 compression=${3:-none} factors=${4:-} batch=${5:-64}
    {
        case $model in
            mlp) printf '[model]\narch = "mlp"\nhidden = [1024, 1024]\n' ;;
            cnn) printf '[model]\narch = "cnn"\nchannels = [16, 32]\nkernel = 3\nfc = 128\n' ;;
            *) echo "unknown model $model" >&2; exit 2 ;;
        esac
        printf '[data]\ndataset = "synthetic"\nsamples = 8192\nval_samples = 64\nshape = [1, 28, 28]\nclasses = 10\n'
        printf '[train]\nepochs = 100\nbatch_per_worker = %d\noptimizer = "sgd"\nlr = 0.01\nwarmup_epochs = 0\n' "$batch"
        printf 'grad_compression = "%s"\n' "$compression"
        if [ -n "$factors" ]; then printf 'sufficient_factors = "%s"\n' "$factors"; fi
    } >"$f"
}
