//! Which stack a row's calls are shown along: the frame-pointer walk the
//! BPF side made for every call, or the stacks unwound from `.eh_frame` for
//! the sampled ones, whichever reaches deeper. Sampled stacks share out
//! their row's exact counts in proportion to their samples. Pure.

use crate::model::AllocStats;
use crate::symbolize::user::UserFrame;

/// How a shown stack was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    FramePointer,
    Dwarf,
}

/// One sampled stack of a row, symbolized: frames, samples, sampled bytes.
pub struct SampledStack {
    pub frames: Vec<UserFrame>,
    /// The raw return addresses (what makes two stacks the same).
    pub addrs: Vec<u64>,
    pub samples: u64,
    pub bytes: u64,
}

/// A part of a row's counts, along one stack.
#[derive(Debug, PartialEq)]
pub struct Share {
    pub frames: Vec<UserFrame>,
    pub addrs: Vec<u64>,
    pub method: Method,
    pub stats: AllocStats,
    /// Outstanding (count, bytes), shared out like the calls.
    pub live: Option<(u64, u64)>,
    /// Not every call of the row was unwound: this share is the row's calls
    /// attributed in proportion to the sampled calls that took its stack,
    /// an estimate (the row's own total stays exact). Frame-pointer walks
    /// are taken on every call and are exact.
    pub estimated: bool,
}

/// Splits a row's counts over its stacks. `walked` is the frame-pointer
/// stack (with its addresses); the sampled stacks replace it when one of
/// them is deeper.
pub fn shares(
    walked: (Vec<UserFrame>, Vec<u64>),
    sampled: Vec<SampledStack>,
    stats: &AllocStats,
    live: Option<(u64, u64)>,
) -> Vec<Share> {
    let deepest = sampled.iter().map(|s| s.frames.len()).max().unwrap_or(0);
    if deepest <= walked.0.len() {
        return vec![Share {
            frames: walked.0,
            addrs: walked.1,
            method: Method::FramePointer,
            stats: *stats,
            live,
            estimated: false,
        }];
    }
    let samples: Vec<u64> = sampled.iter().map(|s| s.samples).collect();
    let estimated = samples.iter().sum::<u64>() < stats.count;
    let bytes: Vec<u64> = sampled.iter().map(|s| s.bytes).collect();
    let counts = split(stats.count, &samples);
    let byte_shares = split(stats.bytes_req, &bytes);
    let hist: Vec<Vec<u64>> = stats.hist.0.iter().map(|&n| split(n, &samples)).collect();
    let live_counts = live.map(|(c, _)| split(c, &samples));
    let live_bytes = live.map(|(_, b)| split(b, &bytes));
    sampled
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let mut st = AllocStats {
                count: counts[i],
                bytes_req: byte_shares[i],
                bytes_alloc: byte_shares[i],
                ..Default::default()
            };
            for (b, h) in st.hist.0.iter_mut().zip(&hist) {
                *b = h[i];
            }
            Share {
                frames: s.frames,
                addrs: s.addrs,
                method: Method::Dwarf,
                estimated,
                stats: st,
                live: live_counts
                    .as_ref()
                    .zip(live_bytes.as_ref())
                    .map(|(c, b)| (c[i], b[i])),
            }
        })
        .collect()
}

/// `total` split in proportion to `weights`, in whole units that add up to
/// `total` (largest remainders get the units rounding left over).
pub fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum == 0 {
        // No weight to go by: all to the first.
        let mut v = vec![0; weights.len()];
        if let Some(f) = v.first_mut() {
            *f = total;
        }
        return v;
    }
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|&w| {
            let p = total as u128 * w as u128;
            ((p / sum) as u64, p % sum)
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.0).collect();
    let left = total - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

/// How many stacks one method gave, and how deep they were.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DepthAcc {
    pub stacks: u64,
    pub max: u64,
    pub sum: u64,
}

impl DepthAcc {
    pub fn add(&mut self, depth: usize) {
        self.stacks += 1;
        self.max = self.max.max(depth as u64);
        self.sum += depth as u64;
    }

    /// Mean depth, to one decimal.
    pub fn mean(&self) -> f64 {
        if self.stacks == 0 {
            0.0
        } else {
            (self.sum as f64 / self.stacks as f64 * 10.0).round() / 10.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Hist;

    fn frames(names: &[&str]) -> Vec<UserFrame> {
        names
            .iter()
            .map(|n| UserFrame {
                function: Some(n.to_string()),
                module: Some("w".into()),
                ..Default::default()
            })
            .collect()
    }

    /// `count` allocations of `size` bytes (the report fixtures' counts).
    fn stats(count: u64, size: u64) -> AllocStats {
        crate::report::fixtures::stats(count, size, size)
    }

    #[test]
    fn split_adds_up_and_follows_weights() {
        assert_eq!(split(10, &[1, 1]), vec![5, 5]);
        assert_eq!(split(10, &[1, 2]), vec![3, 7]);
        assert_eq!(split(7, &[1, 1, 1]), vec![3, 2, 2]);
        assert_eq!(split(5, &[0, 0]), vec![5, 0]);
        assert_eq!(split(100, &[100]), vec![100]);
        assert_eq!(split(0, &[3, 4]), vec![0, 0]);
    }

    #[test]
    fn a_deeper_sampled_stack_replaces_the_walk() {
        let walked = (frames(&["f"]), vec![1]);
        let sampled = vec![
            SampledStack {
                frames: frames(&["f", "g", "main"]),
                addrs: vec![1, 2, 3],
                samples: 3,
                bytes: 300,
            },
            SampledStack {
                frames: frames(&["f", "h", "main"]),
                addrs: vec![1, 4, 3],
                samples: 1,
                bytes: 100,
            },
        ];
        let s = shares(walked, sampled, &stats(40, 100), Some((8, 800)));
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|s| s.method == Method::Dwarf));
        assert_eq!((s[0].stats.count, s[0].stats.bytes_req), (30, 3000));
        assert_eq!((s[1].stats.count, s[1].stats.bytes_req), (10, 1000));
        assert_eq!(s[0].stats.hist.0[Hist::bucket_of(100)], 30);
        assert_eq!((s[0].live, s[1].live), (Some((6, 600)), Some((2, 200))));
        assert!(s.iter().all(|s| s.estimated), "4 of 40 calls unwound");
    }

    /// Shares are exact when every call was unwound (--exact-stacks); else
    /// they are estimates, even when the sampled calls all took one stack
    /// (the calls not sampled may have taken another).
    #[test]
    fn shares_are_estimates_unless_every_call_was_unwound() {
        let sampled = |samples: [u64; 2]| {
            vec![
                SampledStack {
                    frames: frames(&["f", "g", "main"]),
                    addrs: vec![1, 2, 3],
                    samples: samples[0],
                    bytes: samples[0] * 100,
                },
                SampledStack {
                    frames: frames(&["f", "h", "main"]),
                    addrs: vec![1, 4, 3],
                    samples: samples[1],
                    bytes: samples[1] * 100,
                },
            ]
        };
        let walked = || (frames(&["f"]), vec![1]);
        let every_call = shares(walked(), sampled([30, 10]), &stats(40, 100), None);
        assert!(every_call.iter().all(|s| !s.estimated));
        assert_eq!(every_call[0].stats.count, 30);
        let some_calls = shares(walked(), sampled([3, 1]), &stats(40, 100), None);
        assert!(some_calls.iter().all(|s| s.estimated));
        let mut one = sampled([3, 1]);
        one.truncate(1);
        let one_stack = shares(walked(), one, &stats(40, 100), None);
        assert_eq!((one_stack.len(), one_stack[0].estimated), (1, true));
        assert_eq!(one_stack[0].stats.count, 40);
    }

    #[test]
    fn the_walk_stays_when_it_is_as_deep() {
        let walked = (frames(&["f", "g", "main"]), vec![1, 2, 3]);
        let sampled = vec![SampledStack {
            frames: frames(&["f", "g"]),
            addrs: vec![1, 2],
            samples: 1,
            bytes: 100,
        }];
        let s = shares(walked, sampled, &stats(4, 100), None);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].method, Method::FramePointer);
        assert_eq!(s[0].stats, stats(4, 100));
    }

    #[test]
    fn depth_statistics() {
        let mut d = DepthAcc::default();
        for n in [1, 2, 4] {
            d.add(n);
        }
        assert_eq!((d.stacks, d.max, d.mean()), (3, 4, 2.3));
    }
}
