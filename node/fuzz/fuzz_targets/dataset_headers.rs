//! The dataset transport's request and reply headers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringleader::{
    cluster::wire,
    datasets::transport::{Reply, Request},
};

fuzz_target!(|data: &[u8]| {
    let _ = wire::decode::<Request>(data);
    let _ = wire::decode::<Reply>(data);
});
