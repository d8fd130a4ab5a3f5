mod skel {
    include!(concat!(env!("OUT_DIR"), "/kheap.skel.rs"));
}
mod model;
fn main() {}
