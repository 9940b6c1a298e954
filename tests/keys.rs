//! Key derivation (`docs/design.md` §4, `docs/key-spec.md`): the same intent gets the same key whatever
//! its JSON spelling, different intents never share one, and arguments without a JSON form are
//! refused before the tool runs.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use idem_core::key::{caller_key, derive_key, fingerprint};
use idem_core::{
    Classify, Ctx, Error, Failure, Idem, Key, KeyError, RetryClass, Scope, Tool, ToolDef,
    ToolOptions, canonicalize, to_canonical_string,
};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

#[path = "shared/json_values.rs"]
mod json_values;
use json_values::json_value;

/// The arguments of a typical tool, as a model would send them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
struct Charge {
    customer: String,
    amount: f64,
    currency: String,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Lookup {
    id: u64,
}

fn parse<T: DeserializeOwned>(json: &str) -> T {
    match serde_json::from_str(json) {
        Ok(v) => v,
        Err(e) => panic!("test JSON {json} does not parse: {e}"),
    }
}

fn canon<T: Serialize + ?Sized>(value: &T) -> String {
    match to_canonical_string(value) {
        Ok(s) => s,
        Err(e) => panic!("canonicalize failed: {e}"),
    }
}

/// The key a call of `tool` with `args` gets in run `run`.
fn key<T: Serialize + ?Sized>(scope: &Scope, tool: &str, args: &T) -> Key {
    derive_key(scope, tool, canon(args).as_bytes())
}

fn key_of_json<T: Serialize + DeserializeOwned>(json: &str) -> Key {
    key(&Scope::run("run-1"), "charge_card", &parse::<T>(json))
}

/// A map written in exactly the given member order (as an order-preserving map or a
/// hand-written Serialize impl would).
#[derive(Clone, Debug)]
struct Ordered(Vec<(String, Value)>);

impl Serialize for Ordered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[test]
fn permuted_object_members_give_one_key() {
    let a = r#"{"customer":"cus_1","amount":4900,"currency":"eur","metadata":{"order":"7","cart":"3"}}"#;
    let b = r#"{"metadata":{"cart":"3","order":"7"},"currency":"eur","amount":4900,"customer":"cus_1"}"#;
    assert_eq!(key_of_json::<Charge>(a), key_of_json::<Charge>(b));
    // Untyped arguments too.
    assert_eq!(key_of_json::<Value>(a), key_of_json::<Value>(b));
    // And members that reach the serializer in another order (HashMap iteration, hand-written
    // impls): the canonical text is the same byte for byte.
    let members = vec![
        ("b".to_owned(), Value::from(1)),
        ("a".to_owned(), Value::from("x")),
        ("\u{1F600}".to_owned(), Value::Null),
        ("\u{FF61}".to_owned(), Value::Bool(true)),
    ];
    let mut reversed = members.clone();
    reversed.reverse();
    assert_eq!(canon(&Ordered(members)), canon(&Ordered(reversed)));
}

#[test]
fn escaped_and_raw_unicode_give_one_key() {
    let escaped = r#"{"customer":"caf\u00e9 \ud83d\ude00","amount":1,"currency":"eur","metadata":{"caf\u00e9":"\u002f"}}"#;
    let raw = r#"{"customer":"café 😀","amount":1,"currency":"eur","metadata":{"café":"/"}}"#;
    assert_eq!(parse::<Charge>(escaped), parse::<Charge>(raw));
    assert_eq!(key_of_json::<Charge>(escaped), key_of_json::<Charge>(raw));
    assert_eq!(key_of_json::<Value>(escaped), key_of_json::<Value>(raw));
    // The canonical text carries the characters raw, not escaped.
    assert!(canon(&parse::<Charge>(escaped)).contains("café 😀"));
}

#[test]
fn one_and_one_point_zero_in_a_float_field_give_one_key() {
    let int = r#"{"customer":"cus_1","amount":4900,"currency":"eur"}"#;
    let float = r#"{"customer":"cus_1","amount":4900.0,"currency":"eur"}"#;
    let exp = r#"{"customer":"cus_1","amount":4.9e3,"currency":"eur"}"#;
    assert_eq!(key_of_json::<Charge>(int), key_of_json::<Charge>(float));
    assert_eq!(key_of_json::<Charge>(int), key_of_json::<Charge>(exp));
    // Two spellings of one f64, read to the nearest f64 and written shortest. (serde_json's
    // default float parser reads this one a ULP off; idem-core enables `float_roundtrip`.)
    let short = r#"{"customer":"c","amount":4.486744488772239e-176,"currency":"eur"}"#;
    let long = r#"{"customer":"c","amount":44.867444887722390e-177,"currency":"eur"}"#;
    assert_eq!(key_of_json::<Charge>(long), key_of_json::<Charge>(short));
    assert!(canon(&parse::<Charge>(long)).contains(r#""amount":4.486744488772239e-176,"#));
    assert_eq!(
        canon(&parse::<Charge>(float)),
        r#"{"amount":4900,"currency":"eur","customer":"cus_1","metadata":{}}"#
    );
}

#[test]
fn different_values_give_different_keys() {
    let base = r#"{"customer":"cus_1","amount":4900,"currency":"eur"}"#;
    let others = [
        r#"{"customer":"cus_1","amount":4901,"currency":"eur"}"#,
        r#"{"customer":"cus_1","amount":4900.5,"currency":"eur"}"#,
        r#"{"customer":"cus_2","amount":4900,"currency":"eur"}"#,
        r#"{"customer":"cus_1","amount":4900,"currency":"usd"}"#,
        r#"{"customer":"cus_1","amount":4900,"currency":"eur","metadata":{"a":""}}"#,
        r#"{"customer":"cus_1","amount":-4900,"currency":"eur"}"#,
    ];
    let k = key_of_json::<Charge>(base);
    for other in others {
        assert_ne!(k, key_of_json::<Charge>(other), "{other}");
    }
    // Array order is part of the intent.
    assert_ne!(key_of_json::<Value>("[1,2]"), key_of_json::<Value>("[2,1]"));
    // A string is not the number it spells.
    assert_ne!(key_of_json::<Value>(r#"{"id":1}"#), key_of_json::<Value>(r#"{"id":"1"}"#));
}

#[test]
fn u64_ids_above_2_pow_53_that_differ_by_one_give_different_keys() {
    let a = r#"{"id":9007199254740993}"#;
    let b = r#"{"id":9007199254740992}"#;
    // Both round to the same f64, so RFC 8785's number rule alone would collide.
    assert_eq!(9007199254740993u64 as f64, 9007199254740992u64 as f64);
    assert_eq!(canon(&parse::<Lookup>(a)), a);
    assert_eq!(canon(&parse::<Lookup>(b)), b);
    assert_ne!(key_of_json::<Lookup>(a), key_of_json::<Lookup>(b));
    assert_ne!(key_of_json::<Value>(a), key_of_json::<Value>(b));
    let max = format!(r#"{{"id":{}}}"#, u64::MAX);
    let below = format!(r#"{{"id":{}}}"#, u64::MAX - 1);
    assert_ne!(key_of_json::<Lookup>(&max), key_of_json::<Lookup>(&below));
}

#[test]
fn raw_json_arguments_are_canonicalised_like_typed_ones() {
    let raw: Box<serde_json::value::RawValue> =
        parse(r#"{ "currency":"eur", "amount":4900.0, "customer":"caf\u00e9", "metadata":{} }"#);
    let typed: Charge = parse(raw.get());
    assert_eq!(canon(&raw), canon(&typed));
}

/// RFC 8785 §3.1: no object may name a member twice. serde_json's `Value` keeps the last of
/// two, so `{"to":"A","to":"B"}` and `{"to":"B"}` would share a key while the tool, reading the
/// raw text with its own parser, may act on `A`.
#[test]
fn raw_json_that_names_a_member_twice_is_refused() {
    #[derive(Serialize)]
    struct Args {
        extra: Box<serde_json::value::RawValue>,
    }
    for (text, path) in [
        (r#"{"to":"acct-A","to":"acct-B"}"#, "extra.to"),
        (r#"{"a":[{"to":1,"x":0,"to":1}]}"#, "extra.a[0].to"),
        (r#"{"to":"acct-A","\u0074o":"acct-B"}"#, "extra.to"),
    ] {
        let extra: Box<serde_json::value::RawValue> = parse(text);
        assert_eq!(
            to_canonical_string(&Args { extra }),
            Err(KeyError::DuplicateKey { path: path.into() }),
            "{text}"
        );
    }
    // Without a repeat, the same text is canonicalised as before.
    let extra: Box<serde_json::value::RawValue> = parse(r#"{"to":"acct-B","amount":1.0}"#);
    assert_eq!(canon(&Args { extra }), r#"{"extra":{"amount":1,"to":"acct-B"}}"#);
}

#[test]
fn scope_run_tenant_and_tool_are_part_of_the_key() {
    let args = parse::<Charge>(r#"{"customer":"cus_1","amount":4900,"currency":"eur"}"#);
    let base = key(&Scope::run("run-1"), "charge_card", &args);
    assert_eq!(base, key(&Scope::run("run-1"), "charge_card", &args));
    assert_ne!(base, key(&Scope::run("run-2"), "charge_card", &args));
    assert_ne!(base, key(&Scope::run("run-1").with_tenant("acme"), "charge_card", &args));
    assert_ne!(
        key(&Scope::run("run-1").with_tenant("acme"), "charge_card", &args),
        key(&Scope::run("run-1").with_tenant("globex"), "charge_card", &args)
    );
    assert_ne!(base, key(&Scope::run("run-1"), "refund", &args));
    // The key is 64 lowercase hex digits and parses back.
    assert_eq!(base.as_str().len(), 64);
    assert!(base.as_str().bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(Key::parse(base.as_str()), Some(base));
}

#[test]
fn fields_are_framed_so_separators_in_values_cannot_collide() {
    let args = b"{}";
    // ("a:b", "c") vs ("a", "b:c") in every pair of neighbouring fields.
    let tenant_run = |t: &str, r: &str| derive_key(&Scope::run(r).with_tenant(t), "tool", args);
    assert_ne!(tenant_run("a:b", "c"), tenant_run("a", "b:c"));
    assert_ne!(tenant_run("ab", ""), tenant_run("a", "b"));
    let run_tool = |r: &str, tool: &str| derive_key(&Scope::run(r), tool, args);
    assert_ne!(run_tool("a:b", "c"), run_tool("a", "b:c"));
    let tool_args = |tool: &str, a: &[u8]| derive_key(&Scope::run("r"), tool, a);
    assert_ne!(tool_args("a:b", b"c"), tool_args("a", b"b:c"));
    let caller = |tool: &str, k: &str| caller_key(&Scope::run("r"), tool, k);
    assert_ne!(caller("a:b", "c"), caller("a", "b:c"));
    // Domain tags keep a caller's key apart from a derived key with the same bytes.
    assert_ne!(caller("tool", "{}").as_str(), tool_args("tool", b"{}").as_str());
    assert_ne!(fingerprint(b"{}").as_str(), tool_args("", b"{}").as_str());
}

#[test]
fn the_fingerprint_follows_the_arguments_not_the_caller_key() {
    let a = canon(&parse::<Charge>(r#"{"customer":"c","amount":1,"currency":"eur"}"#));
    let b = canon(&parse::<Charge>(r#"{"currency":"eur","amount":1.0,"customer":"c"}"#));
    let c = canon(&parse::<Charge>(r#"{"customer":"c","amount":2,"currency":"eur"}"#));
    assert_eq!(fingerprint(a.as_bytes()), fingerprint(b.as_bytes()));
    assert_ne!(fingerprint(a.as_bytes()), fingerprint(c.as_bytes()));
    let scope = Scope::run("r");
    assert_eq!(
        caller_key(&scope, "charge_card", "order-7"),
        caller_key(&scope, "charge_card", "order-7")
    );
    assert_ne!(
        caller_key(&scope, "charge_card", "order-7"),
        caller_key(&scope, "charge_card", "order-8")
    );
}

#[test]
fn nan_and_infinities_are_refused_with_the_field_path() {
    #[derive(Serialize)]
    struct Item {
        price: f64,
    }
    #[derive(Serialize)]
    struct Order {
        items: Vec<Item>,
    }
    let order =
        |p: f64| Order { items: vec![Item { price: 1.0 }, Item { price: 2.0 }, Item { price: p }] };
    for (value, name) in [(f64::NAN, "NaN"), (f64::INFINITY, "inf"), (f64::NEG_INFINITY, "-inf")] {
        let mut out = Vec::new();
        assert_eq!(
            canonicalize(&order(value), &mut out),
            Err(KeyError::NonFinite { path: "items[2].price".into(), value: name })
        );
        assert!(out.is_empty(), "nothing is written on error");
    }
}

// ---- Through the executor: a NaN argument never reaches the tool. ----

#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct ScaleArgs {
    factor: f64,
}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("scale failed")]
struct ScaleError;

impl Classify for ScaleError {
    fn classify(&self) -> Failure {
        Failure::permanent()
    }
}

/// A keyed tool whose side effect is counting its runs.
struct Scale {
    runs: Arc<AtomicUsize>,
}

static SCALE: LazyLock<ToolDef> = LazyLock::new(|| ToolDef {
    name: "scale",
    description: "Multiplies by the factor, counting each run.",
    class: RetryClass::Keyed,
    options: ToolOptions::default(),
});

impl Tool for Scale {
    type Args = ScaleArgs;
    type Output = f64;
    type Error = ScaleError;

    fn def(&self) -> &'static ToolDef {
        &SCALE
    }
    async fn run(&self, _cx: &Ctx, args: ScaleArgs) -> Result<f64, ScaleError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Ok(args.factor * 2.0)
    }
}

#[tokio::test]
async fn a_nan_argument_is_invalid_and_the_tool_never_runs() {
    let runs = Arc::new(AtomicUsize::new(0));
    let tool = Scale { runs: runs.clone() };
    let run = Idem::in_memory().run("r");

    let result = run.call(&tool, ScaleArgs { factor: f64::NAN }).await;
    match result {
        Err(Error::InvalidArguments { tool, source }) => {
            assert_eq!(tool, "scale");
            assert_eq!(source, KeyError::NonFinite { path: "factor".into(), value: "NaN" });
        }
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool must not run");

    // The same tool with a finite argument runs once and replays: the counter does count.
    assert_eq!(run.call(&tool, ScaleArgs { factor: 1.5 }).await.ok(), Some(3.0));
    assert_eq!(run.call(&tool, ScaleArgs { factor: 1.5 }).await.ok(), Some(3.0));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// ---- Typed calls: two values the tool tells apart, written alike. ----

/// A tip in cents or in dollars, told apart by how the number is written: `5` and `5.0`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum Tip {
    Cents(u64),
    Dollars(f64),
}

/// The same, its float variant first: JSON reads `5` and `5.0` as `Dollars`, but an
/// application can build `Cents(5)`, with the key of `Dollars(5.0)`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum TipFloatFirst {
    Dollars(f64),
    Cents(u64),
}

/// A payment with its tips.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Tipping {
    to: String,
    tips: Vec<Tip>,
    #[serde(default)]
    extra: Option<TipFloatFirst>,
}

static TIPS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Pays the tips.
#[idem_core::tool(retry = "keyed")]
async fn pay_tips(payment: Tipping, amount: f64) -> Result<String, idem_core::NoError> {
    let paid = format!("{} {:?} {amount}", payment.to, payment.tips);
    TIPS.lock().unwrap().push(paid.clone());
    Ok(paid)
}

/// `Dollars(5.0)` and `Cents(5)` were one key (RFC 8785 writes `5.0` as `5`): a typed call of
/// 5 dollars after 5 cents was answered with the cents' outcome, and never ran. It is refused,
/// naming the number's path, before anything is claimed; a float that is not whole, an
/// integer and a whole `f64` field run (and replay) as before.
#[tokio::test]
async fn a_typed_whole_float_an_untagged_enum_reads_as_its_integer_is_refused() {
    let run = Idem::in_memory().run("r");
    let pay =
        |tips: Vec<Tip>| PayTipsArgs::new(Tipping { to: "ann".into(), tips, extra: None }, 20.0);
    let cents = run.call(&PayTipsTool, pay(vec![Tip::Cents(1), Tip::Cents(5)])).await;
    assert_eq!(cents.unwrap(), "ann [Cents(1), Cents(5)] 20");
    for run in [run.clone(), Idem::in_memory().run("fresh")] {
        match run.call(&PayTipsTool, pay(vec![Tip::Cents(1), Tip::Dollars(5.0)])).await {
            Err(Error::InvalidArguments { tool: "pay_tips", source }) => assert_eq!(
                source,
                KeyError::AmbiguousNumber { path: "payment.tips[1]".into(), number: "5.0".into() }
            ),
            other => panic!("expected AmbiguousNumber, got {other:?}"),
        }
    }
    let dollars = run.call(&PayTipsTool, pay(vec![Tip::Cents(1), Tip::Dollars(5.5)])).await;
    assert_eq!(dollars.unwrap(), "ann [Cents(1), Dollars(5.5)] 20");
    let again = run.call(&PayTipsTool, pay(vec![Tip::Cents(1), Tip::Cents(5)])).await;
    assert_eq!(again.unwrap(), "ann [Cents(1), Cents(5)] 20", "replayed");
    // The float variant first: `Dollars(5.0)` reads back as itself, and is refused all the same.
    let extra = |extra| PayTipsArgs::new(Tipping { to: "bob".into(), tips: vec![], extra }, 1.0);
    let cents = run.call(&PayTipsTool, extra(Some(TipFloatFirst::Cents(5)))).await;
    assert_eq!(cents.unwrap(), "bob [] 1");
    match run.call(&PayTipsTool, extra(Some(TipFloatFirst::Dollars(5.0)))).await {
        Err(Error::InvalidArguments {
            source: KeyError::AmbiguousNumber { path, number }, ..
        }) => {
            assert_eq!((path.as_str(), number.as_str()), ("payment.extra", "5.0"));
        }
        other => panic!("expected AmbiguousNumber, got {other:?}"),
    }
    assert_eq!(
        *TIPS.lock().unwrap(),
        ["ann [Cents(1), Cents(5)] 20", "ann [Cents(1), Dollars(5.5)] 20", "bob [] 1"],
        "the cents ran once, the whole dollars never"
    );
}

static TIP_ORDERS: AtomicUsize = AtomicUsize::new(0);

/// Pays tips by order id, with a ledger entry beyond 64 bits beside them.
#[idem_core::tool(retry = "keyed")]
async fn tip_orders(tips: BTreeMap<u64, Tip>, ledger: u128) -> Result<u32, idem_core::NoError> {
    TIP_ORDERS.fetch_add(1, Ordering::SeqCst);
    assert_eq!(ledger, u128::from(u64::MAX) + 1, "the ledger entry as sent");
    Ok(tips.len() as u32)
}

/// Where the check could not see the whole float: below a map with integer keys (its schema is
/// under `patternProperties`), and beside an integer a `serde_json::Value` cannot hold.
#[tokio::test]
async fn a_typed_whole_float_below_an_integer_keyed_map_beside_a_wide_integer_is_refused() {
    let run = Idem::in_memory().run("r");
    let call = |tip| TipOrdersArgs::new(BTreeMap::from([(7, tip)]), u128::from(u64::MAX) + 1);
    assert_eq!(run.call(&TipOrdersTool, call(Tip::Cents(5))).await.unwrap(), 1);
    match run.call(&TipOrdersTool, call(Tip::Dollars(5.0))).await {
        Err(Error::InvalidArguments {
            source: KeyError::AmbiguousNumber { path, number }, ..
        }) => {
            assert_eq!((path.as_str(), number.as_str()), ("tips.7", "5.0"));
        }
        other => panic!("expected AmbiguousNumber, got {other:?}"),
    }
    assert_eq!(TIP_ORDERS.load(Ordering::SeqCst), 1, "the dollars were not answered with cents");
}

/// A ticket update: `description: Some(None)` clears the description, `None` leaves it. Both are
/// written `null`.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct TicketPatch {
    id: String,
    #[serde(default)]
    description: Option<Option<String>>,
}

/// The same update with `None` left out when written: two keys.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct TicketPatchSkipping {
    id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<Option<String>>,
}

static PATCHES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Updates a ticket.
#[idem_core::tool(retry = "keyed")]
async fn patch_ticket(patch: TicketPatch) -> Result<String, idem_core::NoError> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    PATCHES.lock().unwrap().push(done.clone());
    Ok(done)
}

/// Updates a ticket, `None` left out of the key.
#[idem_core::tool(retry = "keyed")]
async fn patch_ticket_skipping(patch: TicketPatchSkipping) -> Result<String, idem_core::NoError> {
    let done = format!("{}: {:?}", patch.id, patch.description);
    PATCHES.lock().unwrap().push(done.clone());
    Ok(done)
}

/// A typed call's `Some(None)` below the parameters ("clear it") had the key of `None` ("leave
/// it") and was answered with the leave's outcome. It is refused, naming the field, where the
/// two share a key; where `None` is left out of the key, both run.
#[tokio::test]
async fn a_typed_some_none_below_the_parameters_is_refused_where_none_has_its_key() {
    let run = Idem::in_memory().run("r");
    let patch = |description| TicketPatch { id: "t1".into(), description };
    let leave = run.call(&PatchTicketTool, PatchTicketArgs::new(patch(None))).await;
    assert_eq!(leave.unwrap(), "t1: None");
    for run in [run.clone(), Idem::in_memory().run("fresh")] {
        match run.call(&PatchTicketTool, PatchTicketArgs::new(patch(Some(None)))).await {
            Err(Error::InvalidArguments { tool: "patch_ticket", source }) => {
                assert_eq!(source, KeyError::AmbiguousNull { path: "patch.description".into() })
            }
            other => panic!("expected AmbiguousNull, got {other:?}"),
        }
    }
    let set = run.call(&PatchTicketTool, PatchTicketArgs::new(patch(Some(Some("x".into())))));
    assert_eq!(set.await.unwrap(), r#"t1: Some(Some("x"))"#);

    let skipping = |description| TicketPatchSkipping { id: "t2".into(), description };
    for description in [None, Some(None)] {
        let args = PatchTicketSkippingArgs::new(skipping(description));
        run.call(&PatchTicketSkippingTool, args).await.unwrap();
    }
    assert_eq!(
        *PATCHES.lock().unwrap(),
        ["t1: None", r#"t1: Some(Some("x"))"#, "t2: None", "t2: Some(None)"],
        "the clear ran only where its key differs from the leave's"
    );
}

static VOTES: AtomicUsize = AtomicUsize::new(0);

/// Records votes by answer.
#[idem_core::tool(retry = "keyed")]
async fn record_votes(votes: BTreeMap<bool, u32>) -> Result<u32, idem_core::NoError> {
    VOTES.fetch_add(1, Ordering::SeqCst);
    Ok(votes.values().sum())
}

/// A map with boolean keys reads from JSON (`{"true": 3}`, as serde_json writes it) but its
/// key was refused, so every call of the tool failed. Its keys are written as serde_json writes
/// them: it runs once, and repeats replay, typed or through a tool set.
#[tokio::test]
async fn a_map_with_boolean_keys_is_keyed_as_json_writes_it() {
    let run = Idem::in_memory().run("r");
    let set = idem_core::ToolSet::new().with(RecordVotesTool).unwrap();
    let args = serde_json::json!({"votes": {"true": 3, "false": 4}});
    for _ in 0..2 {
        let r = set.call(&run, "record_votes", &args).await;
        assert_eq!(r.content, serde_json::json!(7), "{}", r.text);
    }
    let typed = RecordVotesArgs::new(BTreeMap::from([(false, 4), (true, 3)]));
    assert_eq!(run.call(&RecordVotesTool, typed).await.unwrap(), 7);
    assert_eq!(VOTES.load(Ordering::SeqCst), 1, "one intent, one run");
    assert_eq!(
        to_canonical_string(&BTreeMap::from([(true, 3), (false, 4)])).unwrap(),
        r#"{"false":4,"true":3}"#
    );
}

// ---- Properties. ----

/// Equality of JSON data: numbers compare by value (`4900` and `4900.0` are one number, as in
/// RFC 8785), everything else structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64() && (x.is_f64() || y.is_f64()),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Op {
    Stop,
    Refund(u32),
    Move(i16, i16),
    Charge { cents: u64, note: Option<String> },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Nested {
    zeta: Vec<u32>,
    alpha: Option<bool>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Typed {
    name: String,
    id: u64,
    delta: i64,
    amount: f64,
    ratio: f32,
    tags: Vec<String>,
    nested: Nested,
    counts: HashMap<String, i32>,
    by_id: BTreeMap<u32, String>,
    op: Op,
}

fn typed() -> impl Strategy<Value = Typed> {
    let op = prop_oneof![
        Just(Op::Stop),
        any::<u32>().prop_map(Op::Refund),
        (any::<i16>(), any::<i16>()).prop_map(|(a, b)| Op::Move(a, b)),
        (any::<u64>(), proptest::option::of("\\PC{0,6}"))
            .prop_map(|(cents, note)| Op::Charge { cents, note }),
    ];
    (
        ("\\PC{0,10}", any::<u64>(), any::<i64>()),
        (
            any::<f64>().prop_filter("finite", |f| f.is_finite()),
            any::<f32>().prop_filter("finite", |f| f.is_finite()),
        ),
        prop::collection::vec("\\PC{0,5}", 0..4),
        (prop::collection::vec(any::<u32>(), 0..4), proptest::option::of(any::<bool>())),
        prop::collection::hash_map("\\PC{0,5}", any::<i32>(), 0..5),
        prop::collection::btree_map(any::<u32>(), "\\PC{0,5}", 0..5),
        op,
    )
        .prop_map(
            |((name, id, delta), (amount, ratio), tags, (zeta, alpha), counts, by_id, op)| Typed {
                name,
                id,
                delta,
                amount,
                ratio,
                tags,
                nested: Nested { zeta, alpha },
                counts,
                by_id,
                op,
            },
        )
}

proptest! {
    #[test]
    fn the_key_is_deterministic_and_canonical_text_is_a_fixed_point(v in json_value()) {
        let scope = Scope::run("r").with_tenant("t");
        let text = canon(&v);
        prop_assert_eq!(key(&scope, "tool", &v), key(&scope, "tool", &v));
        // Reading the canonical text back and canonicalising again changes nothing.
        let reread: Value = parse(&text);
        prop_assert_eq!(canon(&reread), text.clone());
        prop_assert_eq!(key(&scope, "tool", &reread), derive_key(&scope, "tool", text.as_bytes()));
    }

    #[test]
    fn canonical_text_parses_back_to_the_same_data(v in json_value()) {
        let text = canon(&v);
        let back: Value = parse(&text);
        prop_assert!(same(&v, &back), "{} -> {}", v, text);
    }

    #[test]
    fn permuting_object_members_never_changes_the_text(
        (members, perm) in prop::collection::btree_map("\\PC{0,6}", json_value(), 0..8)
            .prop_flat_map(|m| {
                let members: Vec<(String, Value)> = m.into_iter().collect();
                (Just(members.clone()), Just(members).prop_shuffle())
            })
    ) {
        prop_assert_eq!(canon(&Ordered(members)), canon(&Ordered(perm)));
    }

    #[test]
    fn a_typed_struct_and_its_json_value_have_one_canonical_text(t in typed()) {
        let value = match serde_json::to_value(&t) {
            Ok(v) => v,
            Err(e) => panic!("to_value: {e}"),
        };
        prop_assert_eq!(canon(&t), canon(&value));
        // And the typed value read back from its canonical text is the same intent.
        let back: Typed = parse(&canon(&t));
        prop_assert_eq!(canon(&back), canon(&t));
    }

    #[test]
    fn distinct_integers_give_distinct_text(a in any::<u64>(), b in any::<u64>(), c in any::<i64>(), d in any::<i64>()) {
        prop_assert_eq!(a == b, canon(&a) == canon(&b));
        prop_assert_eq!(c == d, canon(&c) == canon(&d));
        prop_assert_eq!(canon(&a), a.to_string());
        prop_assert_eq!(canon(&c), c.to_string());
    }

    #[test]
    fn neighbouring_integers_beyond_2_pow_53_stay_apart(n in (1u64 << 53)..u64::MAX) {
        prop_assert_ne!(canon(&Lookup { id: n }), canon(&Lookup { id: n + 1 }));
        let (k1, k2) = (key(&Scope::run("r"), "lookup", &Lookup { id: n }), key(&Scope::run("r"), "lookup", &Lookup { id: n + 1 }));
        prop_assert_ne!(k1, k2);
        let neg = -(n as i128);
        prop_assert_ne!(canon(&neg), canon(&(neg - 1)));
    }
}

/// A `RawValue` that names a member twice is refused wherever it sits in the arguments: in a
/// list, as a map's value, in a flattened struct, in an enum's variant, in an `Option`, or as
/// the whole arguments; without a repeat it is canonicalised as a `Value` of its text.
#[test]
fn raw_json_that_names_a_member_twice_is_refused_wherever_it_is_nested() {
    type Raw = Box<serde_json::value::RawValue>;
    #[derive(Serialize)]
    struct InList {
        items: Vec<Raw>,
    }
    #[derive(Serialize)]
    struct InMap {
        by_name: BTreeMap<String, Raw>,
    }
    #[derive(Serialize)]
    struct Inner {
        extra: Raw,
    }
    #[derive(Serialize)]
    struct Flat {
        id: u32,
        #[serde(flatten)]
        inner: Inner,
    }
    #[derive(Serialize)]
    enum Pick {
        Newtype(Raw),
        Struct { extra: Raw },
    }
    #[derive(Serialize)]
    struct InEnum {
        pick: Pick,
    }
    #[derive(Serialize)]
    #[serde(tag = "kind")]
    enum Tagged {
        One { extra: Raw },
    }
    #[derive(Serialize)]
    struct InOption {
        extra: Option<Raw>,
    }
    let dup = r#"{"to":"acct-A","to":"acct-B"}"#;
    let ok = r#"{"to":"acct-B","n":1.0}"#;
    let raw = |t: &str| -> Raw { parse(t) };
    type Canonical<'a> = Box<dyn Fn(&str) -> Result<String, idem_core::KeyError> + 'a>;
    let cases: Vec<(Canonical<'_>, &str)> = vec![
        (
            Box::new(|t| to_canonical_string(&InList { items: vec![raw(ok), raw(t)] })),
            "items[1].to",
        ),
        (
            Box::new(|t| {
                to_canonical_string(&InMap { by_name: BTreeMap::from([("x".into(), raw(t))]) })
            }),
            "by_name.x.to",
        ),
        (
            Box::new(|t| to_canonical_string(&Flat { id: 1, inner: Inner { extra: raw(t) } })),
            "extra.to",
        ),
        (
            Box::new(|t| to_canonical_string(&InEnum { pick: Pick::Newtype(raw(t)) })),
            "pick.Newtype.to",
        ),
        (
            Box::new(|t| to_canonical_string(&InEnum { pick: Pick::Struct { extra: raw(t) } })),
            "pick.Struct.extra.to",
        ),
        (Box::new(|t| to_canonical_string(&Tagged::One { extra: raw(t) })), "extra.to"),
        (Box::new(|t| to_canonical_string(&InOption { extra: Some(raw(t)) })), "extra.to"),
        (Box::new(|t| to_canonical_string(&raw(t))), "to"),
    ];
    for (i, (case, path)) in cases.iter().enumerate() {
        let got = case(dup);
        assert!(
            matches!(&got, Err(KeyError::DuplicateKey { path: p }) if p == path),
            "case {i}: {got:?}, expected the repeat at {path}"
        );
        let fine = case(ok);
        assert!(
            fine.as_ref().is_ok_and(|s| s.contains(r#"{"n":1,"to":"acct-B"}"#)),
            "case {i}: {fine:?}"
        );
    }
}
