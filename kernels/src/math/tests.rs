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

/// Where `got` first differs from `want` in bits (NaNs equal).
fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter().zip(want).position(|(&a, &b)| !same(a, b))
}

/// The C library this test binary runs on, where it is glibc: (major, minor).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc() -> (u32, u32) {
    unsafe extern "C" {
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    // SAFETY: glibc returns a static NUL-terminated string such as "2.36".
    let version = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("0.0")
        .split('.')
        .map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// FNV-1a over the output bits of `f` on every 61st input: what the arithmetic is,
/// recorded, so every machine checks the same bits whatever its C library.
fn digest(f: impl Fn(f32) -> f32) -> u64 {
    digest_of(inputs(61, 0).map(f))
}

/// FNV-1a over output bits, every NaN as one.
fn digest_of(outputs: impl Iterator<Item = f32>) -> u64 {
    outputs.fold(0xCBF2_9CE4_8422_2325, |hash, y| {
        let bits = if y.is_nan() { 0x7FC0_0000 } else { y.to_bits() };
        (hash ^ u64::from(bits)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The recorded digests, made where both functions equalled glibc 2.36's on all 2^32
/// inputs (`exp_and_tanh_equal_glibc_on_every_input`).
#[test]
fn exp_and_tanh_give_the_recorded_bits() {
    assert_eq!(digest(exp), EXP_DIGEST, "exp's bits moved");
    assert_eq!(digest(tanh), TANH_DIGEST, "tanh's bits moved");
}

/// As above for the rotary tables' functions (made where `sin` and `cos` equalled glibc
/// 2.36's on all 2^32 inputs and `pow` on every input `pow_equals_glibc` tries).
#[test]
fn sin_cos_and_pow_give_the_recorded_bits() {
    assert_eq!(digest(sin), SIN_DIGEST, "sin's bits moved");
    assert_eq!(digest(cos), COS_DIGEST, "cos's bits moved");
    // pow over every 9973rd base and a spread of exponents, rotary ones included.
    let exponents = [-2.5f32, -1.0, -0.03125, 0.015625, 0.3, 0.5, 1.0, 3.0, 7.25];
    let pow_digest = |y: f32| digest_of(inputs(9973, 0).map(|x| pow(x, y)));
    let pows: Vec<u64> = exponents.into_iter().map(pow_digest).collect();
    assert_eq!(pows, POW_DIGESTS, "pow's bits moved");
}

const EXP_DIGEST: u64 = 17622996482485295213;
const TANH_DIGEST: u64 = 15114773377043612372;
const SIN_DIGEST: u64 = 15638058655024122675;
const COS_DIGEST: u64 = 15902608639850899069;
const POW_DIGESTS: [u64; 9] = [
    9733111071366868831,
    18236664733692836535,
    13762997248600381841,
    5318383267371499454,
    16609945022399516574,
    11016821285201519181,
    8381360711698026335,
    5301781571673194310,
    722019817657008273,
];

/// Which of the 2^32 inputs the comparisons with the C library check: all of them with
/// `SHAREMESH_EXHAUSTIVE=1` (about six minutes of CPU for the four functions), otherwise
/// every 8th bit pattern from an offset drawn per run and printed, so a test run costs an
/// eighth and successive runs cover every input (a rounding difference is systematic
/// over a range, which every 8th pattern still meets). Returns (step, offset).
fn coverage() -> (u64, u64) {
    if std::env::var_os("SHAREMESH_EXHAUSTIVE").is_some_and(|v| v == "1") {
        return (1, 0);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos());
    let offset = u64::from(nanos) % 8;
    eprintln!("checking every 8th input from {offset} (SHAREMESH_EXHAUSTIVE=1: all of them)");
    (8, offset)
}

/// Every f32 `coverage` names on which `ours` and the C library's `theirs` differ in
/// bits (NaNs equal): the count and the first, the inputs split among the machine's
/// threads.
fn disagreements(ours: fn(f32) -> f32, theirs: fn(f32) -> f32) -> (u64, Option<f32>) {
    let (step, offset) = coverage();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let share = (1u64 << 32).div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let span = t * share..((t + 1) * share).min(1 << 32);
                    let mut found = (0u64, None);
                    let first = span.start + (offset + step - span.start % step) % step;
                    for bits in (first..span.end).step_by(step as usize) {
                        let x = f32::from_bits(bits as u32);
                        if !same(ours(x), theirs(x)) {
                            found.0 += 1;
                            found.1 = found.1.or(Some(x));
                        }
                    }
                    found
                })
            })
            .collect();
        parts.into_iter().fold((0, None), |(count, first), part| {
            let (n, x) = part.join().expect("a checking thread panicked");
            (count + n, first.or(x))
        })
    })
}

/// The comparison meets every input `coverage` names: a "library" that differs on all
/// of [1, 2) (2^23 inputs) is found that many times over the step, from any offset.
#[test]
fn disagreements_meet_every_covered_input() {
    let (step, _) = coverage();
    let ours = |x: f32| x;
    let theirs = |x: f32| if (1.0..2.0).contains(&x) { -x } else { x };
    let (count, first) = disagreements(ours, theirs);
    assert_eq!(count, (1 << 23) / step);
    assert!(first.is_some_and(|x| (1.0..2.0).contains(&x)));
}

/// On glibc's x86-64 FMA build (what `f32::exp` calls here where the CPU has FMA) the
/// kernels' `exp` gives the library's bits, and on glibc before 2.41 (fdlibm's `tanhf`)
/// `tanh` gives its bits — on every f32 (`coverage`: every 8th in an ordinary run). Elsewhere the
/// library is not the reference and the recorded digests above check the bits instead.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn exp_and_tanh_equal_glibc_on_every_input() {
    if std::is_x86_feature_detected!("fma") {
        let (count, first) = disagreements(exp, f32::exp);
        assert_eq!(
            count, 0,
            "exp differs from glibc's expf, first at {first:?}"
        );
    } else {
        eprintln!("exp skipped: glibc runs its SSE2 expf on a CPU without FMA");
    }
    if glibc() < (2, 41) {
        let (count, first) = disagreements(tanh, f32::tanh);
        assert_eq!(
            count, 0,
            "tanh differs from glibc's tanhf, first at {first:?}"
        );
    } else {
        eprintln!(
            "tanh skipped: glibc {:?} has a correctly rounded tanhf",
            glibc()
        );
    }
}

/// On glibc ≥ 2.28's x86-64 FMA build `sin` and `cos` give `sinf`'s and `cosf`'s bits on
/// every f32 (`coverage`: every 8th in an ordinary run); without FMA glibc runs its SSE2 build, which
/// rounds 34 inputs differently, and the recorded digests check the bits instead.
#[test]
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn sin_and_cos_equal_glibc_on_every_input() {
    if !std::is_x86_feature_detected!("fma") || glibc() < (2, 28) {
        eprintln!(
            "skipped: glibc {:?} without FMA is not the reference",
            glibc()
        );
        return;
    }
    let (count, first) = disagreements(sin, f32::sin);
    assert_eq!(
        count, 0,
        "sin differs from glibc's sinf, first at {first:?}"
    );
    let (count, first) = disagreements(cos, f32::cos);
    assert_eq!(
        count, 0,
        "cos differs from glibc's cosf, first at {first:?}"
    );
}

/// On glibc ≥ 2.28 `pow` gives `powf`'s bits on every rotary frequency of common bases
/// and head sizes, on IEEE 754's special cases, and on 2·10^7 random pairs (both glibc
/// builds agree on them: the algorithm rounds from ~2^-26 relative error).
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn pow_equals_glibc() {
    if glibc() < (2, 28) {
        eprintln!("skipped: glibc {:?} predates its current powf", glibc());
        return;
    }
    let check = |x: f32, y: f32| {
        let (ours, theirs) = (pow(x, y), x.powf(y));
        assert!(
            same(ours, theirs),
            "pow({x:e}, {y:e}) = {ours:e}, powf {theirs:e}"
        );
    };
    for base in [1e4f32, 5e4, 1e5, 5e5, 1e6, 1e7, 8e6, 2.0, 3.5] {
        for dims in [16u16, 32, 48, 64, 80, 96, 128, 160, 256, 512] {
            for i in 0..dims {
                let y = f32::from(i) / f32::from(dims);
                check(base, y);
                check(base, -y);
            }
        }
    }
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        0.5,
        -2.0,
        3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    let specials = specials
        .into_iter()
        .chain([f32::NAN, f32::from_bits(1), -f32::from_bits(5)]);
    for x in specials.clone() {
        for y in specials.clone() {
            check(x, y);
        }
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20_000_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        check(
            f32::from_bits(seed as u32),
            f32::from_bits((seed >> 32) as u32),
        );
    }
}

/// The vector builds give the scalar bits (slices of every length, so the
/// leftovers after whole vectors run too), and SiLU · up is the scalar formula's.
#[test]
fn vector_builds_give_the_scalar_bits() {
    let all: Vec<f32> = inputs(7919, 3).collect();
    for len in [0, 1, 7, 8, 9, 15, 16, 17, 33, all.len()] {
        let want: Vec<f32> = all[..len].iter().map(|&x| exp(x)).collect();
        let mut got = all[..len].to_vec();
        exp_in_place(&mut got);
        let bad = first_difference(&got, &want);
        assert!(bad.is_none(), "len {len}: input {:?}", bad.map(|i| all[i]));
        let up: Vec<f32> = all[..len].iter().rev().copied().collect();
        let want: Vec<f32> = all[..len]
            .iter()
            .zip(&up)
            .map(|(&g, &u)| silu_mul_one(g, u))
            .collect();
        let mut got = all[..len].to_vec();
        silu_mul(&mut got, &up);
        let bad = first_difference(&got, &want);
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
    in_slices(inputs(7, 2), |slice| {
        let want: Vec<f32> = slice.iter().map(|&x| exp(x)).collect();
        for (name, build) in &builds {
            let mut got = slice.to_vec();
            // SAFETY: detected above.
            unsafe { build(&mut got) };
            let bad = first_difference(&got, &want);
            assert!(bad.is_none(), "{name}: input {:?}", bad.map(|i| slice[i]));
        }
    });
}

/// `check` on `inputs` in slices of 4096 (the vector builds' leftovers included).
#[cfg(target_arch = "x86_64")]
fn in_slices(mut inputs: impl Iterator<Item = f32>, mut check: impl FnMut(&[f32])) {
    loop {
        let slice: Vec<f32> = inputs.by_ref().take(4096).collect();
        if slice.is_empty() {
            return;
        }
        check(&slice);
    }
}

/// The AVX-512 tanh gives the scalar's bits on every 7th input (all 2^32 agreed when it
/// was written), and GELU · up is the scalar formula's on every build.
#[test]
fn vector_tanh_and_gelu_give_the_scalar_bits() {
    #[cfg(target_arch = "x86_64")]
    if Vector::detect() == Some(Vector::Avx512) {
        in_slices(inputs(7, 4), |slice| {
            let want: Vec<f32> = slice.iter().map(|&x| tanh(x)).collect();
            let mut got = slice.to_vec();
            // SAFETY: detected above.
            unsafe { tanh_avx512::tanh_in_place_avx512(&mut got) };
            let bad = first_difference(&got, &want);
            assert!(bad.is_none(), "tanh of {:?}", bad.map(|i| slice[i]));
        });
    }
    let all: Vec<f32> = inputs(7919, 9).collect();
    for len in [0, 1, 15, 16, 17, 40, all.len()] {
        let up: Vec<f32> = all[..len]
            .iter()
            .rev()
            .map(|u| u.clamp(-4.0, 4.0))
            .collect();
        let want: Vec<f32> = all[..len]
            .iter()
            .zip(&up)
            .map(|(&g, &u)| gelu_mul_one(g, u))
            .collect();
        let mut got = all[..len].to_vec();
        gelu_mul(&mut got, &up);
        let bad = first_difference(&got, &want);
        assert!(
            bad.is_none(),
            "GELU len {len}: input {:?}",
            bad.map(|i| all[i])
        );
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

#[test]
fn tanh_edges() {
    assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanh(f32::INFINITY), 1.0);
    assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh(30.0), 1.0);
    assert!(tanh(f32::NAN).is_nan());
    assert!((tanh(0.5) - 0.462_117_16).abs() <= 1e-7);
    assert!((tanh(-2.0) + 0.964_027_6).abs() <= 1e-7);
    assert!((super::tanh::expm1(1e-3) - 1.000_500_2e-3).abs() <= 1e-10);
}
