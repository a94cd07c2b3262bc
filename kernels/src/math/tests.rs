use super::*;

/// Every `step`-th f32 bit pattern from `offset`, and every special value.
fn inputs(step: u32, offset: u32) -> impl Iterator<Item = f32> {
    let specials = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        OVERFLOW,
        UNDERFLOW,
    ];
    let edges = [OVERFLOW, UNDERFLOW, 88.0, -88.0, -87.33655, -103.27893]
        .into_iter()
        .flat_map(|e: f32| {
            (-4i32..=4).map(move |d| f32::from_bits(e.to_bits().wrapping_add_signed(d)))
        });
    (offset..=u32::MAX)
        .step_by(step as usize)
        .map(f32::from_bits)
        .chain(specials)
        .chain(edges)
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// On glibc's x86-64 FMA build (what this machine's `f32::exp` calls where the CPU has
/// FMA) the kernels' `exp` gives the library's bits: every 13th input here (all 2^32 of
/// them agreed when this was written: `exp_equals_glibc_on_every_input`).
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn exp_equals_glibc_fma_expf() {
    if !std::is_x86_feature_detected!("fma") {
        eprintln!("skipped: glibc runs its SSE2 expf on a CPU without FMA");
        return;
    }
    let mut wrong = Vec::new();
    for x in inputs(13, 5) {
        if !same(exp(x), x.exp()) {
            wrong.push((x, exp(x), x.exp()));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} inputs differ, first {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(4)]
    );
}

/// The exhaustive form of the test above (a minute in a release build).
#[test]
#[ignore = "exhaustive: every f32; run with --ignored"]
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn exp_equals_glibc_on_every_input() {
    assert!(std::is_x86_feature_detected!("fma"));
    let wrong = inputs(1, 0).filter(|&x| !same(exp(x), x.exp())).count();
    assert_eq!(wrong, 0);
}

/// The vector builds give the scalar `exp`'s bits (slices of every length, so the
/// leftovers after whole vectors run too), and SiLU · up is the scalar formula's.
#[test]
fn vector_builds_give_the_scalar_bits() {
    let all: Vec<f32> = inputs(7919, 3).collect();
    for len in [0, 1, 7, 8, 9, 15, 16, 17, 33, all.len()] {
        let want: Vec<f32> = all[..len].iter().map(|&x| exp(x)).collect();
        let mut got = all[..len].to_vec();
        exp_in_place(&mut got);
        let bad = got.iter().zip(&want).position(|(&a, &b)| !same(a, b));
        assert!(bad.is_none(), "len {len}: input {:?}", bad.map(|i| all[i]));
        let up: Vec<f32> = all[..len].iter().rev().copied().collect();
        let want: Vec<f32> = all[..len]
            .iter()
            .zip(&up)
            .map(|(&g, &u)| g / (1.0 + exp(-g)) * u)
            .collect();
        let mut got = all[..len].to_vec();
        silu_mul(&mut got, &up);
        let bad = got.iter().zip(&want).position(|(&a, &b)| !same(a, b));
        assert!(
            bad.is_none(),
            "SiLU len {len}: input {:?}",
            bad.map(|i| all[i])
        );
    }
}

/// Every build this CPU runs, on every 7th input in slices of 4096: the AVX2 build is
/// checked even where AVX-512 is the one `exp_in_place` picks.
#[test]
#[cfg(target_arch = "x86_64")]
fn each_vector_build_gives_the_scalar_bits() {
    type Build = unsafe fn(&mut [f32]);
    let mut builds: Vec<(&str, Build)> = Vec::new();
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        builds.push(("avx2", x86::exp_in_place_avx2));
    }
    if Vector::detect() == Some(Vector::Avx512) {
        builds.push(("avx512", x86::exp_in_place_avx512));
    }
    let mut inputs = inputs(7, 2);
    loop {
        let slice: Vec<f32> = inputs.by_ref().take(4096).collect();
        if slice.is_empty() {
            break;
        }
        let want: Vec<f32> = slice.iter().map(|&x| exp(x)).collect();
        for (name, build) in &builds {
            let mut got = slice.clone();
            // SAFETY: detected above.
            unsafe { build(&mut got) };
            let bad = got.iter().zip(&want).position(|(&a, &b)| !same(a, b));
            assert!(bad.is_none(), "{name}: input {:?}", bad.map(|i| slice[i]));
        }
    }
}

#[test]
fn exp_edges() {
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-0.0), 1.0);
    assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert!(exp(f32::NAN).is_nan());
    assert_eq!(exp(OVERFLOW), f32::MAX.min(exp(OVERFLOW)));
    assert!(exp(OVERFLOW).is_finite() && exp(f32::from_bits(OVERFLOW.to_bits() + 1)).is_infinite());
    assert_eq!(exp(f32::from_bits(UNDERFLOW.to_bits() + 1)), 0.0);
    assert!((exp(1.0) - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
}
