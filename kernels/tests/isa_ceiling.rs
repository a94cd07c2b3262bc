//! `hold_to_avx2` in a process of its own: it changes what every later detection picks.
#![allow(clippy::unwrap_used)]

use sharemesh_kernels::dot::Isa;

#[test]
fn held_to_avx2_the_kernels_pick_avx2_where_the_cpu_has_avx512() {
    let before = Isa::detect();
    sharemesh_kernels::hold_to_avx2();
    let after = Isa::detect();
    match (Isa::avx512(), Isa::avx2()) {
        (Some(_), Some(avx2)) => {
            assert_eq!(before.name(), "avx512-vnni");
            assert_eq!(after, avx2);
        }
        // Without AVX-512 there is nothing to hold back: the same build either way.
        _ => assert_eq!(after, before),
    }
}
