//! Compile-time behaviour of `#[tool]`: what it accepts, and the message for each mistake.
//! After changing a message, regenerate with `TRYBUILD=overwrite` and read every `.stderr`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/attr/*.rs");
    t.compile_fail("tests/ui/shape/*.rs");
    t.compile_fail("tests/ui/skip/*.rs");
    t.compile_fail("tests/ui/types/*.rs");
    t.compile_fail("tests/ui/tool_set/*.rs");
    t.compile_fail("tests/ui/reconcile/*.rs");
}
