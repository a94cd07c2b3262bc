//! The vector builds of [`super::exp`]: the same double-precision operations per lane
//! (the table read with a gather on AVX2, with two-register permutes on AVX-512), the
//! edge cases (NaN, overflow, underflow) blended in afterwards.

use std::arch::x86_64::*;

use super::{exp, C0, C1, C2, INV_LN2_N, OVERFLOW, SHIFT, TABLE, UNDERFLOW};

/// # Safety
/// AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_in_place_avx2(values: &mut [f32]) {
    let mut chunks = values.chunks_exact_mut(8);
    for chunk in &mut chunks {
        // SAFETY: eight values.
        unsafe { _mm256_storeu_ps(chunk.as_mut_ptr(), exp8(_mm256_loadu_ps(chunk.as_ptr()))) };
    }
    for v in chunks.into_remainder() {
        *v = exp(*v);
    }
}

/// # Safety
/// AVX2 and FMA; `gate.len() == up.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    let mut gates = gate.chunks_exact_mut(8);
    let mut ups = up.chunks_exact(8);
    for (g, u) in (&mut gates).zip(&mut ups) {
        // SAFETY (loads and store): eight values each.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr());
            let e = exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0)));
            let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    for (g, &u) in gates.into_remainder().iter_mut().zip(ups.remainder()) {
        *g = super::silu_mul_one(*g, u);
    }
}

/// Eight `exp`s.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let low = exp4d(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let high = exp4d(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    let y = _mm256_set_m128(_mm256_cvtpd_ps(high), _mm256_cvtpd_ps(low));
    let y = _mm256_blendv_ps(
        y,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(OVERFLOW)),
    );
    let y = _mm256_blendv_ps(
        y,
        _mm256_setzero_ps(),
        _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(UNDERFLOW)),
    );
    _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// The scalar `exp`'s double-precision steps on four lanes (before the edge cases).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp4d(x: __m256d) -> __m256d {
    let inv = _mm256_set1_pd(INV_LN2_N);
    let shift = _mm256_set1_pd(SHIFT);
    let shifted = _mm256_add_pd(_mm256_mul_pd(inv, x), shift);
    let k = _mm256_castpd_si256(shifted);
    let r = _mm256_fmsub_pd(inv, x, _mm256_sub_pd(shifted, shift));
    let index = _mm256_and_si256(k, _mm256_set1_epi64x(31));
    // SAFETY: every index is below 32, the table's length.
    let entry = unsafe { _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast(), index) };
    let scale = _mm256_castsi256_pd(_mm256_add_epi64(entry, _mm256_slli_epi64::<47>(k)));
    let cubic = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
    let linear = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(cubic, _mm256_mul_pd(r, r), linear);
    _mm256_mul_pd(y, scale)
}

/// # Safety
/// AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp_in_place_avx512(values: &mut [f32]) {
    let table = Table::load();
    let mut chunks = values.chunks_exact_mut(16);
    for chunk in &mut chunks {
        // SAFETY: sixteen values.
        unsafe {
            _mm512_storeu_ps(
                chunk.as_mut_ptr(),
                exp16(&table, _mm512_loadu_ps(chunk.as_ptr())),
            )
        };
    }
    for v in chunks.into_remainder() {
        *v = exp(*v);
    }
}

/// # Safety
/// AVX-512 F; `gate.len() == up.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    let table = Table::load();
    let mut gates = gate.chunks_exact_mut(16);
    let mut ups = up.chunks_exact(16);
    for (g, u) in (&mut gates).zip(&mut ups) {
        // SAFETY (loads and store): sixteen values each.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr());
            let minus = _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(x),
                _mm512_set1_epi32(i32::MIN),
            ));
            let e = exp16(&table, minus);
            let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
            _mm512_storeu_ps(
                g.as_mut_ptr(),
                _mm512_mul_ps(silu, _mm512_loadu_ps(u.as_ptr())),
            );
        }
    }
    for (g, &u) in gates.into_remainder().iter_mut().zip(ups.remainder()) {
        *g = super::silu_mul_one(*g, u);
    }
}

/// The table in four registers of eight entries.
struct Table([__m512i; 4]);

impl Table {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn load() -> Self {
        // SAFETY: each load reads eight of the table's 32 entries.
        Table(std::array::from_fn(|i| unsafe {
            _mm512_loadu_si512(TABLE.as_ptr().add(8 * i).cast())
        }))
    }
}

/// Sixteen `exp`s.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(table: &Table, x: __m512) -> __m512 {
    let high_half = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    let low = _mm512_cvtpd_ps(exp8d(table, _mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    let high = _mm512_cvtpd_ps(exp8d(table, _mm512_cvtps_pd(high_half)));
    let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(low)),
        _mm256_castps_pd(high),
    ));
    let over = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(OVERFLOW));
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(UNDERFLOW));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    let y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(f32::INFINITY));
    let y = _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
    _mm512_mask_blend_ps(nan, y, _mm512_add_ps(x, x))
}

/// The scalar `exp`'s double-precision steps on eight lanes (before the edge cases).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp8d(table: &Table, x: __m512d) -> __m512d {
    let inv = _mm512_set1_pd(INV_LN2_N);
    let shift = _mm512_set1_pd(SHIFT);
    let shifted = _mm512_add_pd(_mm512_mul_pd(inv, x), shift);
    let k = _mm512_castpd_si512(shifted);
    let r = _mm512_fmsub_pd(inv, x, _mm512_sub_pd(shifted, shift));
    // Entry k mod 32: bits 0–3 pick within a pair of registers, bit 4 the pair.
    let [t0, t1, t2, t3] = table.0;
    let first = _mm512_permutex2var_epi64(t0, k, t1);
    let second = _mm512_permutex2var_epi64(t2, k, t3);
    let upper = _mm512_test_epi64_mask(k, _mm512_set1_epi64(16));
    let entry = _mm512_mask_blend_epi64(upper, first, second);
    let scale = _mm512_castsi512_pd(_mm512_add_epi64(entry, _mm512_slli_epi64::<47>(k)));
    let cubic = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
    let linear = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(cubic, _mm512_mul_pd(r, r), linear);
    _mm512_mul_pd(y, scale)
}
