//! Percentiles, medians and formatting.

/// The `p`-th percentile (0..=100) of sorted samples, nearest rank.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `xs` (mean of the middle two for an even count).
pub(crate) fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The order in which `k` variants run in round (or call) `start`: every
/// index of `0..k` once, beginning at `start % k` and wrapping, so that over
/// successive rounds each variant takes each place in turn and noise from
/// other processes falls on every variant alike.
pub(crate) fn rotation(start: usize, k: usize) -> impl Iterator<Item = usize> {
    (0..k).map(move |j| (start + j) % k)
}

/// Per-round ratios of a variant to a baseline: `xs[r] / base[r]` for every
/// round `r` (the baseline measured in the same round, so that drift over
/// the run cancels out).
pub(crate) fn ratios(xs: &[f64], base: &[f64]) -> Vec<f64> {
    xs.iter().zip(base).map(|(a, b)| a / b).collect()
}

/// Smallest and largest of `xs`.
pub(crate) fn range(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// `1.03×` with the range of rounds: `1.03× (0.99–1.07)`.
pub(crate) fn ratio_cell(xs: &[f64]) -> String {
    let (lo, hi) = range(xs);
    format!("**{:.2}×** ({lo:.2}–{hi:.2})", median(xs))
}

/// Microseconds from nanoseconds, for tables.
pub(crate) fn us(ns: f64) -> String {
    format!("{:.1} µs", ns / 1000.0)
}

/// A count per second, for tables: `123 456/s`.
pub(crate) fn per_sec(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push('\u{202f}');
        }
        out.push(c);
    }
    format!("{out}/s")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(per_sec(1234567.0), "1\u{202f}234\u{202f}567/s");
    }

    #[test]
    fn rotations_and_ratios() {
        assert_eq!(rotation(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(rotation(4, 3).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(ratios(&[2.0, 9.0], &[1.0, 3.0]), [2.0, 3.0]);
    }
}
