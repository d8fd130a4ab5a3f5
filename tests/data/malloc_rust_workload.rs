// kheap malloc test workload (tests/host_only/malloc_langs.rs): Rust allocations
// through the global allocator with known counts; make_boxes leaks its boxes.
#[inline(never)]
fn make_vecs() -> usize {
    let mut n = 0;
    for i in 0..1000 {
        let v: Vec<u64> = Vec::with_capacity(10 + (i % 2));
        n += std::hint::black_box(v).capacity();
    }
    n
}
#[inline(never)]
fn make_boxes() -> Vec<Box<[u8; 48]>> {
    (0..300).map(|_| Box::new([7u8; 48])).collect()
}
#[inline(never)]
fn grow(v: &mut Vec<u32>) {
    for i in 0..37 {
        v.reserve_exact(1);
        v.push(i);
    }
}
fn main() {
    let a = make_vecs();
    let b = make_boxes();
    let mut g = Vec::new();
    grow(&mut g);
    println!("{} {} {}", a, b.len(), g.len());
    std::mem::forget(b);
}
