//! How a matrix keeps its scales and minimums: f32, f16 where every one is an f16
//! value, or factored as a K-quant file makes them ([`crate::blocks::Factors`]); the
//! views the kernels read them through; and the factored form's builder.

use half::f16;

use super::GROUP;
use crate::blocks::{self, Format, KernelBlock, BLOCK};

/// A matrix's scales or minimums.
#[derive(Clone, Debug)]
pub(super) enum Store {
    F32(Vec<f32>),
    F16(Vec<u16>),
    /// K-quants' values as their files keep them ([`blocks::Factors`]): value `i` is
    /// `units[(i / 16 / span) · 16 + i % 16] × factors[i]`, one unit per row per `span`
    /// values of that row (a super-block's; an f16 value, kept widened: the kernels
    /// load it as is, and it is 1/32 of the bytes a factor saves).
    Factored {
        units: Vec<f32>,
        factors: Vec<i8>,
        span: usize,
    },
}

impl Store {
    /// Every value, as a group's view reads them.
    pub(super) fn all(&self) -> Scales<'_> {
        match self {
            Store::F32(v) => Scales::F32(v),
            Store::F16(v) => Scales::F16(v),
            Store::Factored {
                units,
                factors,
                span,
            } => Scales::Factored {
                units,
                factors,
                span: *span,
            },
        }
    }

    /// The same values as f16 bits, if every one is exactly an f16.
    pub(super) fn compact(values: &[f32]) -> Option<Vec<u16>> {
        values
            .iter()
            .map(|&v| {
                let half = f16::from_f32(v);
                (half.to_f32().to_bits() == v.to_bits()).then_some(half.to_bits())
            })
            .collect()
    }
}

/// A group's scales or minimums, as the matrix keeps them.
#[derive(Clone, Copy, Debug)]
pub enum Scales<'a> {
    F32(&'a [f32]),
    /// f16 bits.
    F16(&'a [u16]),
    /// Units (one per row per `span` values) times i8 factors (one per value).
    Factored {
        units: &'a [f32],
        factors: &'a [i8],
        span: usize,
    },
}

impl Scales<'_> {
    pub fn len(&self) -> usize {
        match self {
            Scales::F32(v) => v.len(),
            Scales::F16(v) => v.len(),
            Scales::Factored { factors, .. } => factors.len(),
        }
    }

    /// Where value `i`'s unit is in a factored store.
    #[inline]
    pub(crate) fn unit_index(i: usize, span: usize) -> usize {
        (i / GROUP / span) * GROUP + i % GROUP
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values `range` (whole spans of 16 rows, as a group's are).
    pub(super) fn slice(self, range: std::ops::Range<usize>) -> Self {
        match self {
            Scales::F32(v) => Scales::F32(&v[range]),
            Scales::F16(v) => Scales::F16(&v[range]),
            Scales::Factored {
                units,
                factors,
                span,
            } => Scales::Factored {
                units: &units[range.start / span..range.end / span],
                factors: &factors[range],
                span,
            },
        }
    }

    pub(super) fn bytes(&self) -> usize {
        match self {
            Scales::F32(v) => 4 * v.len(),
            Scales::F16(v) => 2 * v.len(),
            Scales::Factored { units, factors, .. } => 4 * units.len() + factors.len(),
        }
    }

    /// Value `i`, widened to f32 (exact; a factored value is its one f32 product).
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Scales::F32(v) => v[i],
            Scales::F16(v) => f16::from_bits(v[i]).to_f32(),
            Scales::Factored {
                units,
                factors,
                span,
            } => units[Self::unit_index(i, *span)] * f32::from(factors[i]),
        }
    }

    /// The address of value `i` (past the end allowed: for prefetch hints only).
    #[inline]
    pub(crate) fn address(&self, i: usize) -> *const u8 {
        match self {
            Scales::F32(v) => v.as_ptr().wrapping_add(i).cast(),
            Scales::F16(v) => v.as_ptr().wrapping_add(i).cast(),
            Scales::Factored { factors, .. } => factors.as_ptr().wrapping_add(i).cast(),
        }
    }
}

/// Blocks per K-quant super-block: the span of one unit ([`blocks::Factors`]).
pub(super) const BLOCKS_PER_SUPER: usize = blocks::SUPER_BLOCK / BLOCK;

/// A matrix's scales and minimums in factored form, built beside the f32 values while
/// every block carries factors whose unit is one per row per super-block (a K-quant
/// file's always do; any other matrix gives up at its first block).
pub(super) struct Factoring {
    format: Format,
    blocks: usize,
    scale_units: Vec<Option<u16>>,
    scale_factors: Vec<i8>,
    min_units: Vec<Option<u16>>,
    min_factors: Vec<i8>,
    possible: bool,
}

impl Factoring {
    pub(super) fn new(format: Format, groups: usize, blocks: usize) -> Self {
        let possible = blocks.is_multiple_of(BLOCKS_PER_SUPER) && format != Format::Q8_0;
        let (units, values, mins) = if possible {
            let units = groups * (blocks / BLOCKS_PER_SUPER) * GROUP;
            let values = groups * blocks * GROUP;
            (units, values * format.scales_per_block(), values)
        } else {
            (0, 0, 0)
        };
        let has_min = format.has_min();
        Factoring {
            format,
            blocks,
            scale_units: vec![None; units],
            scale_factors: vec![0; values],
            min_units: vec![None; if has_min { units } else { 0 }],
            min_factors: vec![0; if has_min { mins } else { 0 }],
            possible,
        }
    }

    /// Records row `r` of group block `at` (`group · blocks + block`).
    pub(super) fn put(&mut self, at: usize, r: usize, block: &KernelBlock) {
        if !self.possible {
            return;
        }
        let Some(factors) = block.factors else {
            self.possible = false;
            return;
        };
        let (g, b) = (at / self.blocks, at % self.blocks);
        let unit_at = (g * (self.blocks / BLOCKS_PER_SUPER) + b / BLOCKS_PER_SUPER) * GROUP + r;
        let agree = |slot: &mut Option<u16>, unit: u16| *slot.get_or_insert(unit) == unit;
        let has_min = self.format.has_min();
        if !agree(&mut self.scale_units[unit_at], factors.scale_unit)
            || (has_min && !agree(&mut self.min_units[unit_at], factors.min_unit))
        {
            self.possible = false;
            return;
        }
        let subs = self.format.scales_per_block();
        for s in 0..subs {
            self.scale_factors[(at * subs + s) * GROUP + r] = factors.scale[s];
        }
        if has_min {
            self.min_factors[at * GROUP + r] = factors.min;
        }
    }

    /// One store of each from every group's, in group order (`None` if any group's
    /// blocks were not all factored).
    pub(super) fn join(
        groups: Vec<Option<(Store, Store)>>,
        format: Format,
    ) -> Option<(Store, Store)> {
        if groups.is_empty() {
            return None;
        }
        let (mut scale_units, mut scale_factors) = (Vec::new(), Vec::new());
        let (mut min_units, mut min_factors) = (Vec::new(), Vec::new());
        for group in groups {
            let (
                Store::Factored {
                    units: su,
                    factors: sf,
                    ..
                },
                Store::Factored {
                    units: mu,
                    factors: mf,
                    ..
                },
            ) = group?
            else {
                return None;
            };
            scale_units.extend(su);
            scale_factors.extend(sf);
            min_units.extend(mu);
            min_factors.extend(mf);
        }
        Some((
            Store::Factored {
                units: scale_units,
                factors: scale_factors,
                span: BLOCKS_PER_SUPER * format.scales_per_block(),
            },
            Store::Factored {
                units: min_units,
                factors: min_factors,
                span: BLOCKS_PER_SUPER,
            },
        ))
    }

    /// The (scales, minimums) stores, if every block was factored.
    pub(super) fn finish(self) -> Option<(Store, Store)> {
        if !self.possible {
            return None;
        }
        let units = |all: Vec<Option<u16>>| {
            all.into_iter()
                .map(|unit| unit.map(|bits| f16::from_bits(bits).to_f32()))
                .collect::<Option<Vec<f32>>>()
        };
        Some((
            Store::Factored {
                units: units(self.scale_units)?,
                factors: self.scale_factors,
                span: BLOCKS_PER_SUPER * self.format.scales_per_block(),
            },
            Store::Factored {
                units: units(self.min_units)?,
                factors: self.min_factors,
                span: BLOCKS_PER_SUPER,
            },
        ))
    }
}
