//! The four weight layouts the kernels compute on ([`Format`]), and the GGUF block
//! types files store, converted into them.
//!
//! Every conversion keeps llama.cpp's dequantized values exactly (`dequantize_row_*` in
//! ggml-quants.c): a K-quant's sub-block scale `d·sc` and minimum `dmin·m` are products
//! of an f16 and a 6- or 8-bit integer, exact in f32, and so are the weights they make
//! (Q6_K: `d·sc·q` has at most 11 + 7 + 6 = 24 significant bits). So Q4_0 and Q4_K are
//! Q4_1 blocks with other scales and minimums (Q4_0: `−8d`), Q5_0/Q5_1/Q5_K are 5-bit
//! [`Format::Q5_1`] blocks (Q5_0: minimum `−16d`), and Q6_K keeps its scale per 16.

use half::f16;

/// Weights per quantization block.
pub const BLOCK: usize = 32;

/// The layouts the kernels compute on, 32 weights per block (files' block types map
/// onto them: [`BlockType::kernel_format`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // named after the GGUF type each layout is
pub enum Format {
    /// 4-bit unsigned quants, two per byte, with a scale and a minimum per block:
    /// w = d·q + m, q ∈ 0..16 (from Q4_0, Q4_1, Q4_K).
    Q4_1,
    /// 5-bit unsigned quants (Q4_1's nibbles, and the fifth bits as a bit plane), with
    /// a scale and a minimum per block (from Q5_0, Q5_1, Q5_K).
    Q5_1,
    /// 8-bit signed quants with a scale per block: w = d·q, q ∈ -128..128 (held as
    /// `q + 128`).
    Q8_0,
    /// 6-bit signed quants (−32..32, held as `q + 32`), one per byte, with a scale per
    /// 16 weights (from Q6_K).
    Q6_K,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Q4_1, Format::Q5_1, Format::Q8_0, Format::Q6_K];

    /// Bytes one block of a row group (16 rows, see [`crate::quant::Matrix`]) holds:
    /// Q4_1 packs two quants per byte, Q5_1 adds their fifth bits (a bit per weight),
    /// Q8_0 and Q6_K keep one byte per weight.
    #[inline]
    pub fn group_block_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 256,
            Format::Q5_1 => 320,
            Format::Q8_0 | Format::Q6_K => 512,
        }
    }

    /// Whether weights carry a minimum (`d·q + m`) and the dot its offset term.
    #[inline]
    pub fn has_min(self) -> bool {
        matches!(self, Format::Q4_1 | Format::Q5_1)
    }

    /// What a stored byte exceeds the quant it stands for by: signed quants are kept
    /// as unsigned bytes (`q + offset`), the operand `vpdpbusd` multiplies, and the
    /// dot subtracts `offset · Σ activations` as an exact integer.
    #[inline]
    pub fn offset(self) -> i32 {
        match self {
            Format::Q4_1 | Format::Q5_1 => 0,
            Format::Q8_0 => 128,
            Format::Q6_K => 32,
        }
    }

    /// Scales per block: two where each 16 weights have their own.
    #[inline]
    pub fn scales_per_block(self) -> usize {
        if self == Format::Q6_K {
            2
        } else {
            1
        }
    }

    /// The integer a kernel block's quant byte stands for (two's complement for the
    /// signed formats).
    pub(crate) fn quant_value(self, byte: u8) -> f32 {
        if self.offset() != 0 {
            f32::from(byte as i8)
        } else {
            f32::from(byte)
        }
    }

    /// The quants this layout may hold; the SIMD paths rely on it (AVX2's
    /// `maddubs` sums two u8·i8 products in an i16 without overflow: Q8_0's signs move
    /// onto the activations there).
    pub fn quant_range(self) -> std::ops::Range<i32> {
        match self {
            Format::Q4_1 => 0..16,
            Format::Q5_1 => 0..32,
            Format::Q8_0 => -128..128,
            Format::Q6_K => -32..32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Q4_1 => "Q4_1",
            Format::Q5_1 => "Q5_1",
            Format::Q8_0 => "Q8_0",
            Format::Q6_K => "Q6_K",
        }
    }
}

/// A block type of the GGUF file (llama.cpp's `ggml_type`) the kernels can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // the names files and llama.cpp use
pub enum BlockType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Elements per K-quant super-block.
pub const SUPER_BLOCK: usize = 256;

impl BlockType {
    pub const ALL: [BlockType; 8] = [
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q4_K,
        BlockType::Q5_K,
        BlockType::Q6_K,
    ];

    /// Elements one stored block covers.
    pub fn elements(self) -> usize {
        match self {
            BlockType::Q4_K | BlockType::Q5_K | BlockType::Q6_K => SUPER_BLOCK,
            _ => BLOCK,
        }
    }

    /// Bytes of one stored block.
    pub fn bytes(self) -> usize {
        match self {
            BlockType::Q4_0 => 18,
            BlockType::Q4_1 => 20,
            BlockType::Q5_0 => 22,
            BlockType::Q5_1 => 24,
            BlockType::Q8_0 => 34,
            BlockType::Q4_K => 144,
            BlockType::Q5_K => 176,
            BlockType::Q6_K => 210,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            BlockType::Q4_0 => "Q4_0",
            BlockType::Q4_1 => "Q4_1",
            BlockType::Q5_0 => "Q5_0",
            BlockType::Q5_1 => "Q5_1",
            BlockType::Q8_0 => "Q8_0",
            BlockType::Q4_K => "Q4_K",
            BlockType::Q5_K => "Q5_K",
            BlockType::Q6_K => "Q6_K",
        }
    }

    /// The layout the kernels hold this block type in.
    pub fn kernel_format(self) -> Format {
        match self {
            BlockType::Q4_0 | BlockType::Q4_1 | BlockType::Q4_K => Format::Q4_1,
            BlockType::Q5_0 | BlockType::Q5_1 | BlockType::Q5_K => Format::Q5_1,
            BlockType::Q8_0 => Format::Q8_0,
            BlockType::Q6_K => Format::Q6_K,
        }
    }
}

/// One 32-element block in the kernels' terms, before packing: quants (two's
/// complement bytes for the signed formats), the scale of each half (equal unless
/// the format has a scale per 16) and the minimum (zero for signed formats).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct KernelBlock {
    pub quants: [u8; BLOCK],
    pub scales: [f32; 2],
    pub min: f32,
    /// How a K-quant's file stores `scales` and `min` (`None` for other types).
    pub factors: Option<Factors>,
}

/// A K-quant block's scales as its file stores them: each an f16 unit of its
/// super-block times a small integer, `unit × factor` in f32 being exactly the value
/// (at most 11 + 8 significant bits). A matrix keeps a byte per value and a half per
/// super-block instead of an f32 per value: a quarter of the bytes decoding streams
/// for scales (`quant::Matrix`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Factors {
    /// f16 bits of `d`.
    pub scale_unit: u16,
    pub scale: [i8; 2],
    /// f16 bits of `−dmin` (so `unit × m` is `−(dmin·m)` to the bit, zero's sign too).
    pub min_unit: u16,
    pub min: i8,
}

impl Factors {
    /// `unit × factor` as the kernels compute it (the same f32 product every time).
    #[inline]
    pub fn value(unit: u16, factor: i8) -> f32 {
        f16::from_bits(unit).to_f32() * f32::from(factor)
    }
}

fn half_at(raw: &[u8], at: usize) -> f32 {
    f16::from_bits(bits_at(raw, at)).to_f32()
}

fn bits_at(raw: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([raw[at], raw[at + 1]])
}

/// Decodes one stored block (`block_type.bytes()` long) into its 32-element kernel
/// blocks, in element order.
pub(crate) fn decode(block_type: BlockType, raw: &[u8], emit: &mut impl FnMut(KernelBlock)) {
    debug_assert_eq!(raw.len(), block_type.bytes());
    let one = |d: f32, min: f32| KernelBlock {
        quants: [0; BLOCK],
        scales: [d, d],
        min,
        factors: None,
    };
    match block_type {
        BlockType::Q4_0 | BlockType::Q4_1 => {
            let d = half_at(raw, 0);
            let (min, qs) = match block_type {
                BlockType::Q4_0 => (-8.0 * d, &raw[2..18]),
                _ => (half_at(raw, 2), &raw[4..20]),
            };
            let mut block = one(d, min);
            for (j, &byte) in qs.iter().enumerate() {
                block.quants[j] = byte & 0x0F;
                block.quants[j + 16] = byte >> 4;
            }
            emit(block);
        }
        BlockType::Q5_0 | BlockType::Q5_1 => {
            let d = half_at(raw, 0);
            let (min, rest) = match block_type {
                BlockType::Q5_0 => (-16.0 * d, &raw[2..]),
                _ => (half_at(raw, 2), &raw[4..]),
            };
            let high = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
            let mut block = one(d, min);
            for (j, &byte) in rest[4..20].iter().enumerate() {
                block.quants[j] = (byte & 0x0F) | ((((high >> j) << 4) & 0x10) as u8);
                block.quants[j + 16] = (byte >> 4) | (((high >> (j + 12)) & 0x10) as u8);
            }
            emit(block);
        }
        BlockType::Q8_0 => {
            let mut block = one(half_at(raw, 0), 0.0);
            block.quants.copy_from_slice(&raw[2..34]);
            emit(block);
        }
        BlockType::Q4_K | BlockType::Q5_K => decode_q45_k(block_type, raw, emit),
        BlockType::Q6_K => decode_q6_k(raw, emit),
    }
}

/// llama.cpp's `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j`.
fn scale_min_k4(j: usize, packed: &[u8]) -> (u8, u8) {
    if j < 4 {
        (packed[j] & 63, packed[j + 4] & 63)
    } else {
        (
            (packed[j + 4] & 0x0F) | ((packed[j - 4] >> 6) << 4),
            (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
        )
    }
}

/// Q4_K (144 bytes: d, dmin, 12 bytes of scales, 128 of nibbles) and Q5_K (176: the
/// same with 32 bytes of fifth bits before the nibbles): eight sub-blocks of 32, each
/// `d·sc·q − dmin·m`.
fn decode_q45_k(block_type: BlockType, raw: &[u8], emit: &mut impl FnMut(KernelBlock)) {
    let (d_bits, dmin_bits) = (bits_at(raw, 0), bits_at(raw, 2));
    // −dmin: f16 negation is its sign bit.
    let neg_dmin_bits = dmin_bits ^ 0x8000;
    let packed_scales = &raw[4..16];
    let (fifth_bits, nibbles) = match block_type {
        BlockType::Q5_K => (Some(&raw[16..48]), &raw[48..176]),
        _ => (None, &raw[16..144]),
    };
    for sub in 0..8 {
        let (sc, m) = scale_min_k4(sub, packed_scales);
        // Six bits each: they fit an i8.
        let (sc, m) = (sc as i8, m as i8);
        let mut block = KernelBlock {
            quants: [0; BLOCK],
            scales: [Factors::value(d_bits, sc); 2],
            min: Factors::value(neg_dmin_bits, m),
            factors: Some(Factors {
                scale_unit: d_bits,
                scale: [sc; 2],
                min_unit: neg_dmin_bits,
                min: m,
            }),
        };
        // Sub-blocks 2j and 2j+1 share 32 bytes: low nibbles, then high ones.
        let bytes = &nibbles[(sub / 2) * 32..][..32];
        for (l, quant) in block.quants.iter_mut().enumerate() {
            let nibble = if sub % 2 == 0 {
                bytes[l] & 0x0F
            } else {
                bytes[l] >> 4
            };
            let fifth = fifth_bits.map_or(0, |h| ((h[l] >> sub) & 1) << 4);
            *quant = nibble | fifth;
        }
        emit(block);
    }
}

/// Q6_K (210 bytes: 128 of low nibbles, 64 of high bit pairs, 16 signed scales, d):
/// sixteen sub-blocks of 16, each `d·sc·(q − 32)`.
fn decode_q6_k(raw: &[u8], emit: &mut impl FnMut(KernelBlock)) {
    let (low, high, scales) = (&raw[0..128], &raw[128..192], &raw[192..208]);
    let d_bits = bits_at(raw, 208);
    for n in 0..2 {
        let (low, high) = (&low[n * 64..][..64], &high[n * 32..][..32]);
        // Quarter t of this 128-element half: nibble from `low[l + 32·(t % 2)]`, low
        // (t < 2) or high; bit pair t of `high[l]`; scale 8n + 2t + l/16.
        for t in 0..4 {
            let factor = |half: usize| scales[n * 8 + 2 * t + half] as i8;
            let mut block = KernelBlock {
                quants: [0; BLOCK],
                scales: [
                    Factors::value(d_bits, factor(0)),
                    Factors::value(d_bits, factor(1)),
                ],
                min: 0.0,
                factors: Some(Factors {
                    scale_unit: d_bits,
                    scale: [factor(0), factor(1)],
                    min_unit: 0,
                    min: 0,
                }),
            };
            for (l, quant) in block.quants.iter_mut().enumerate() {
                let byte = low[l + 32 * (t % 2)];
                let nibble = if t < 2 { byte & 0x0F } else { byte >> 4 };
                let pair = (high[l] >> (2 * t)) & 3;
                *quant = ((nibble | (pair << 4)) as i8 - 32) as u8;
            }
            emit(block);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// llama.cpp's `dequantize_row_*`, transcribed element by element from
    /// ggml-quants.c with no shared code, for the decoder to agree with.
    pub(crate) fn llama_cpp_dequantize(block_type: BlockType, raw: &[u8]) -> Vec<f32> {
        let d = half_at(raw, 0);
        let mut y = vec![0f32; block_type.elements()];
        match block_type {
            BlockType::Q4_0 => {
                for j in 0..16 {
                    y[j] = f32::from(i16::from(raw[2 + j] & 0x0F) - 8) * d;
                    y[j + 16] = f32::from(i16::from(raw[2 + j] >> 4) - 8) * d;
                }
            }
            BlockType::Q4_1 => {
                let m = half_at(raw, 2);
                for j in 0..16 {
                    y[j] = f32::from(raw[4 + j] & 0x0F) * d + m;
                    y[j + 16] = f32::from(raw[4 + j] >> 4) * d + m;
                }
            }
            BlockType::Q5_0 | BlockType::Q5_1 => {
                let (m, at) = if block_type == BlockType::Q5_1 {
                    (half_at(raw, 2), 4)
                } else {
                    (0.0, 2)
                };
                let qh = u32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes"));
                for j in 0..16 {
                    let xh0 = (((qh >> j) << 4) & 0x10) as i32;
                    let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
                    let mut x0 = i32::from(raw[at + 4 + j] & 0x0F) | xh0;
                    let mut x1 = i32::from(raw[at + 4 + j] >> 4) | xh1;
                    if block_type == BlockType::Q5_0 {
                        x0 -= 16;
                        x1 -= 16;
                    }
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
            }
            BlockType::Q8_0 => {
                for j in 0..32 {
                    y[j] = f32::from(raw[2 + j] as i8) * d;
                }
            }
            BlockType::Q4_K | BlockType::Q5_K => {
                let dmin = half_at(raw, 2);
                let five = block_type == BlockType::Q5_K;
                let qh = &raw[16..48];
                let mut ql = if five { 48 } else { 16 };
                let (mut u1, mut u2) = (1u8, 2u8);
                let mut out = 0;
                for is in (0..8).step_by(2) {
                    let (sc, m) = scale_min_k4(is, &raw[4..16]);
                    let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
                    let (sc, m) = scale_min_k4(is + 1, &raw[4..16]);
                    let (d2, m2) = (d * f32::from(sc), dmin * f32::from(m));
                    for l in 0..32 {
                        let high = if five && qh[l] & u1 != 0 { 16 } else { 0 };
                        y[out] = d1 * f32::from((raw[ql + l] & 0xF) + high) - m1;
                        out += 1;
                    }
                    for l in 0..32 {
                        let high = if five && qh[l] & u2 != 0 { 16 } else { 0 };
                        y[out] = d2 * f32::from((raw[ql + l] >> 4) + high) - m2;
                        out += 1;
                    }
                    ql += 32;
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
            BlockType::Q6_K => {
                let d = half_at(raw, 208);
                for n in 0..2 {
                    let (ql, qh, sc) = (n * 64, 128 + n * 32, 192 + n * 8);
                    for l in 0..32 {
                        let is = l / 16;
                        let q = |low: u8, shift: u32| {
                            f32::from(((low | (((raw[qh + l] >> shift) & 3) << 4)) as i8) - 32)
                        };
                        let s = |k: usize| d * f32::from(raw[sc + is + k] as i8);
                        y[n * 128 + l] = s(0) * q(raw[ql + l] & 0xF, 0);
                        y[n * 128 + l + 32] = s(2) * q(raw[ql + l + 32] & 0xF, 2);
                        y[n * 128 + l + 64] = s(4) * q(raw[ql + l] >> 4, 4);
                        y[n * 128 + l + 96] = s(6) * q(raw[ql + l + 32] >> 4, 6);
                    }
                }
            }
        }
        y
    }

    /// Random bytes for one block with finite, plausible f16 scales.
    pub(crate) fn random_block(block_type: BlockType, rng: &mut impl rand::Rng) -> Vec<u8> {
        let mut raw: Vec<u8> = (0..block_type.bytes()).map(|_| rng.random()).collect();
        let mut put = |at: usize, value: f32| {
            raw[at..at + 2].copy_from_slice(&f16::from_f32(value).to_le_bytes());
        };
        let d = rng.random_range(-0.05f32..0.05);
        match block_type {
            BlockType::Q6_K => put(208, d),
            BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q4_K | BlockType::Q5_K => {
                put(0, d);
                put(2, rng.random_range(-0.4f32..0.4));
            }
            _ => put(0, d),
        }
        raw
    }

    #[test]
    fn every_block_type_decodes_to_llama_cpps_values() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for block_type in BlockType::ALL {
            for _ in 0..200 {
                let raw = random_block(block_type, &mut rng);
                let mut values = Vec::new();
                decode(block_type, &raw, &mut |block| {
                    values.extend(block.quants.iter().enumerate().map(|(e, &q)| {
                        block.scales[e / 16] * block_type.kernel_format().quant_value(q) + block.min
                    }));
                });
                let want = llama_cpp_dequantize(block_type, &raw);
                assert_eq!(values.len(), want.len());
                for (e, (got, want)) in values.iter().zip(&want).enumerate() {
                    // == rather than bits: Q4_0/Q5_0's `d·q + (−8d)` is +0 where
                    // llama.cpp's `(q − 8)·d` may be −0.
                    assert!(got == want, "{block_type:?} element {e}: {got} vs {want}");
                }
            }
        }
    }

    #[test]
    fn kernel_quants_stay_in_their_formats_range() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(12);
        for block_type in BlockType::ALL {
            let format = block_type.kernel_format();
            for _ in 0..200 {
                let raw = random_block(block_type, &mut rng);
                decode(block_type, &raw, &mut |block| {
                    for &q in &block.quants {
                        let value = format.quant_value(q);
                        assert!(
                            format.quant_range().contains(&(value as i32)),
                            "{block_type:?}: {value} outside {:?}",
                            format.quant_range()
                        );
                    }
                });
            }
        }
    }
}
