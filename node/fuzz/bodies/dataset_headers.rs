//! The dataset transport's request and reply headers.

use ringleader::{
    cluster::wire,
    datasets::transport::{Reply, Request},
};

pub fn run(data: &[u8]) {
    let _ = wire::decode::<Request>(data);
    let _ = wire::decode::<Reply>(data);
}
