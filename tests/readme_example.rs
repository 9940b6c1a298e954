//! The README's first command, `cargo run --example double_charge`, prints what the README says
//! it prints: every line of its abridged output block is a line of the example's output.

#[test]
fn the_example_prints_the_lines_the_readme_shows() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README.md");
    let shown = readme
        .split("(abridged):\n\n```text\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the README shows the example's output in a ```text block after \"(abridged):\"");
    let ran = std::process::Command::new(env!("CARGO"))
        .current_dir(root)
        .args(["run", "--quiet", "--example", "double_charge"])
        .output()
        .expect("cargo runs");
    let out = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{:?}: {out}{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    let printed: Vec<&str> = out.lines().map(str::trim).collect();
    let mut lines = 0;
    for line in shown.lines().map(str::trim) {
        assert!(printed.contains(&line), "the README shows {line:?}; the example printed:\n{out}");
        lines += 1;
    }
    assert_eq!(lines, 8, "{shown}");
}
