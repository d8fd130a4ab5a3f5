use super::*;

fn sample(frames: &[&str], count: u64, bytes: u64) -> Sample {
    Sample {
        frames: frames.iter().map(|s| s.to_string()).collect(),
        count,
        bytes,
        waste: bytes / 4,
        before: None,
    }
}

fn labels() -> Labels<'static> {
    Labels {
        title: "kheap record",
        subtitle: "sub",
        bytes_word: "allocated",
    }
}

/// The `data-<key>` values of every frame named `name`.
fn attr_of(svg: &str, name: &str, key: &str) -> Vec<u64> {
    svg.lines()
        .filter(|l| l.contains(&format!("<title>{}&#10;", escape(name))))
        .map(|l| {
            let tag = format!("data-{key}=\"");
            let rest = &l[l.find(&tag).unwrap() + tag.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

#[test]
fn frames_sum_their_stacks_and_the_root_is_the_total() {
    let s = [
        sample(&["main", "a", "kmalloc"], 3, 300),
        sample(&["main", "b", "kmalloc"], 1, 100),
        sample(&["other", "kmalloc"], 2, 50),
    ];
    let out = svg(&s, Weight::Bytes, &labels());
    assert_eq!(attr_of(&out, "all", "bytes"), [450]);
    assert_eq!(attr_of(&out, "all", "count"), [6]);
    assert_eq!(attr_of(&out, "main", "bytes"), [400]);
    // kmalloc under three different callers: three frames.
    assert_eq!(attr_of(&out, "kmalloc", "count"), [3, 1, 2]);
    assert!(out.contains("data-total=\"450\""), "{out}");
}

#[test]
fn weight_decides_widths() {
    let s = [sample(&["a"], 1, 300), sample(&["b"], 3, 100)];
    let by_count = svg(&s, Weight::Count, &labels());
    let by_bytes = svg(&s, Weight::Bytes, &labels());
    let width_of = |svg: &str, n: &str| -> String {
        let l = svg
            .lines()
            .find(|l| l.contains(&format!("<title>{n}&#10;")))
            .unwrap();
        let i = l.find("data-w=\"").unwrap() + 8;
        l[i..i + 8].to_string()
    };
    assert_eq!(width_of(&by_count, "a"), "0.250000");
    assert_eq!(width_of(&by_bytes, "a"), "0.750000");
}

#[test]
fn symbols_are_escaped() {
    let s = [sample(&["std::vector<int>::push_back&", "\"q'"], 1, 8)];
    let out = svg(&s, Weight::Bytes, &labels());
    assert!(
        out.contains("std::vector&lt;int&gt;::push_back&amp;"),
        "{out}"
    );
    assert!(out.contains("&quot;q&apos;"), "{out}");
    assert!(!out.contains("<int>"));
}

#[test]
fn output_is_deterministic_and_colours_follow_names() {
    let s = [
        sample(&["z", "k"], 1, 8),
        sample(&["a", "k"], 1, 8),
        sample(&["m"], 1, 8),
    ];
    let mut reversed = s.to_vec();
    reversed.reverse();
    assert_eq!(
        svg(&s, Weight::Bytes, &labels()),
        svg(&reversed, Weight::Bytes, &labels())
    );
    assert_eq!(colour("kmalloc"), colour("kmalloc"));
    assert_ne!(colour("kmalloc"), colour("kfree"));
}

#[test]
fn differential_colours_growth_red_and_shrinkage_blue() {
    let mut grew = sample(&["grows"], 10, 1000);
    grew.before = Some(100);
    let mut shrank = sample(&["shrinks"], 1, 10);
    shrank.before = Some(500);
    let out = svg(&[grew, shrank], Weight::Bytes, &labels());
    let fill = |n: &str| {
        let l = out
            .lines()
            .find(|l| l.contains(&format!("<title>{n}&#10;")))
            .unwrap();
        let i = l.find("fill=\"").unwrap() + 6;
        l[i..i + l[i..].find('"').unwrap()].to_string()
    };
    assert_eq!(fill("grows"), "rgb(255,80,80)", "the largest change");
    assert!(fill("shrinks").starts_with("rgb(") && fill("shrinks").ends_with(",255)"));
    assert!(out.contains("change +900"), "{out}");
    assert!(out.contains("change -490"), "{out}");
}

#[test]
fn labels_fit_their_frames() {
    assert_eq!(fit("kmalloc", 100.0), "kmalloc");
    assert_eq!(fit("kmem_cache_alloc_noprof", 60.0), "kmem_..");
    assert_eq!(fit("kmalloc", 20.0), "");
}

#[test]
fn empty_input_is_still_a_document() {
    let out = svg(&[], Weight::Bytes, &labels());
    assert!(out.starts_with("<?xml") && out.ends_with("</svg>\n"));
    assert!(!out.contains("class=\"f\""));
}

/// 15,000-frame stacks overflowed the stack in `diff --format svg` (issue
/// 47): drawn up to MAX_FRAMES, the rest one frame that says so; weights
/// at u64::MAX saturate instead of wrapping.
#[test]
fn very_deep_stacks_and_huge_weights_are_drawn() {
    let deep = |tag: &str| -> Vec<String> { (0..15_000).map(|i| format!("{tag}{i}")).collect() };
    let samples = vec![
        Sample {
            frames: deep("f"),
            count: u64::MAX,
            bytes: u64::MAX,
            waste: 0,
            before: Some(1),
        },
        Sample {
            frames: deep("f"),
            count: u64::MAX,
            bytes: u64::MAX,
            waste: 0,
            before: Some(u64::MAX),
        },
        Sample {
            frames: deep("g"),
            count: 1,
            bytes: 1,
            waste: 0,
            before: Some(0),
        },
    ];
    // The size of kheap's main thread, where diff draws.
    let out = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || svg(&samples, Weight::Bytes, &labels()))
        .unwrap()
        .join()
        .expect("drawn without overflowing the stack");
    let cut = cut_frame(15_000 - (MAX_FRAMES - 1));
    assert_eq!(attr_of(&out, &cut, "bytes"), [u64::MAX, 1]);
    assert_eq!(attr_of(&out, "f0", "bytes"), [u64::MAX]);
    assert_eq!(
        attr_of(&out, &format!("f{}", MAX_FRAMES - 2), "l"),
        [MAX_FRAMES as u64 - 1]
    );
    assert!(!out.contains(&format!("f{}&#10;", MAX_FRAMES - 1)));
}
