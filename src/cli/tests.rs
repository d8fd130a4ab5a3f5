use super::*;

#[test]
fn sizes() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("2M"), Ok(2 << 20));
    assert!(parse_size("12q").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("-1").is_err());
}

#[test]
fn ranges_and_periods() {
    assert!(check_size_range(10, Some(5))
        .unwrap_err()
        .to_string()
        .contains("bad size range"));
    assert!(check_size_range(10, None).is_ok());
    assert_eq!(parse_sample("64"), Ok(64));
    assert!(parse_sample("48").is_err());
}

#[test]
fn durations_are_bounded() {
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("604800"), Ok(MAX_DURATION));
    for bad in [
        "0",
        "-1",
        "1e300",
        "1e19",
        "604801",
        "inf",
        "NaN",
        "",
        "1s",
        "0.0000001",
    ] {
        let e = parse_duration(bad).unwrap_err();
        assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
    }
    // The largest accepted interval can be added to now.
    let far = std::time::Instant::now().checked_add(parse_duration("604800").unwrap());
    assert!(far.is_some());
}

#[test]
fn map_sizes_are_bounded() {
    assert_eq!(parse_map_entries("4"), Ok(4));
    assert_eq!(parse_map_entries("1048576"), Ok(MAX_MAP_ENTRIES));
    for bad in ["0", "4294967295", "1048577", "-1", "x"] {
        let e = parse_map_entries(bad).unwrap_err();
        assert!(e.contains("from 1 to 1048576"), "{bad}: {e}");
    }
    assert_eq!(parse_tracked_objects("262144"), Ok(262144));
    assert!(parse_tracked_objects("0").is_err());
    assert!(parse_tracked_objects("16777217").is_err());
}

#[test]
fn comm_must_be_matchable() {
    assert_eq!(parse_comm("kheap-load"), Ok("kheap-load".into()));
    assert!(parse_comm("").unwrap_err().contains("empty"));
    let e = parse_comm("a\nb").unwrap_err();
    assert!(e.starts_with("\"a\\nb\" has a control character"), "{e}");
    let e = parse_cgroup("").unwrap_err();
    assert!(e.contains("an empty cgroup path"), "{e}");
    // It does not suggest what is then refused (issue 47).
    assert!(!e.contains("'/'"), "{e}");
    for root in ["/", "//"] {
        let e = parse_cgroup(root).unwrap_err();
        assert!(e.contains("is the root cgroup"), "{e}");
        assert!(e.contains("leave --cgroup out"), "{e}");
    }
    let e = parse_comm("a-very-long-command-name").unwrap_err();
    assert!(e.contains("use 'a-very-long-com'"), "{e}");
}

#[derive(clap::Parser, Debug)]
struct Demo {
    #[arg(short, value_parser = parse_duration, allow_hyphen_values = true)]
    d: Option<Duration>,
    #[arg(long, requires = "d")]
    r: bool,
    #[arg(last = true)]
    cmd: Vec<String>,
}

#[test]
fn clap_errors_are_one_line_without_the_dash_dash_tip() {
    use clap::Parser;
    let e = Demo::try_parse_from(["demo", "-5"]).unwrap_err();
    let line = one_line_error(&e);
    assert!(!line.contains('\n'), "{line}");
    assert!(!line.contains("'-- -5'"), "{line}");
    assert!(line.contains("negative numbers are not accepted"), "{line}");
    let e = Demo::try_parse_from(["demo", "-d", "-inf"]).unwrap_err();
    let line = one_line_error(&e);
    assert!(line.contains("'-inf' is not a positive number"), "{line}");
    let e = Demo::try_parse_from(["demo", "-d", "1e300"]).unwrap_err();
    let line = one_line_error(&e);
    assert!(line.contains("too long"), "{line}");
    assert!(!line.contains('\n'), "{line}");
    let e = Demo::try_parse_from(["demo", "--r"]).unwrap_err();
    let line = one_line_error(&e);
    assert!(line.contains("not provided: -d"), "{line}");
    assert!(!line.contains('\n'), "{line}");
}
