#!/usr/bin/env python3
"""Independent reference for idem's key derivation (docs/key-spec.md), in plain Python 3.

It shares no code with the Rust implementation: the canonical JSON (RFC 8785 with idem's
stricter integer rule) and the ECMAScript number format are written out below from the
specifications, and the digits of a float come from Python's shortest round-trip `repr`.

    python3 docs/key_vectors.py           # writes tests/vectors/keys.json
    python3 docs/key_vectors.py --check   # recomputes the file and reports any difference

`cargo test --test key_vectors` then checks the Rust implementation against the file.
"""

import decimal
import hashlib
import json
import math
import struct
import sys
from pathlib import Path

KEY_TAG = b"idem-key/v1"
CALLER_KEY_TAG = b"idem-caller-key/v1"
FINGERPRINT_TAG = b"idem-fingerprint/v1"

# ---------------------------------------------------------------------------------------------
# Canonical JSON.


def es_number(x: float) -> str:
    """ECMAScript Number::toString (ECMA-262 §6.1.6.1.20) of a finite float."""
    if not math.isfinite(x):
        raise ValueError("NaN and infinities have no JSON form")
    if x == 0:
        return "0"  # -0 too
    if x < 0:
        return "-" + es_number(-x)
    # Shortest digits that round-trip (Python's repr), as digits * 10**exp.
    sign, digits, exp = decimal.Decimal(repr(x)).as_tuple()
    s = "".join(map(str, digits)).rstrip("0")
    exp += len(digits) - len(s)
    s = s.lstrip("0")
    k = len(s)
    n = exp + k  # x = 0.s * 10**n
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + s
    e = n - 1
    mantissa = s if k == 1 else s[0] + "." + s[1:]
    return mantissa + "e" + ("+" if e >= 0 else "-") + str(abs(e))


SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def es_string(s: str) -> str:
    """RFC 8785 §3.2.2.2: minimal escapes, lowercase \\u00xx for other controls, the rest raw."""
    out = ['"']
    for ch in s:
        if ch in SHORT_ESCAPES:
            out.append(SHORT_ESCAPES[ch])
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canonical(v) -> str:
    """RFC 8785 text; Python ints are written exactly (idem's stricter integer rule)."""
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return es_number(v)
    if isinstance(v, str):
        return es_string(v)
    if isinstance(v, list):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    if isinstance(v, dict):
        # Sort by UTF-16 code units: big-endian UTF-16 bytes compare in code-unit order.
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(es_string(k) + ":" + canonical(v[k]) for k in keys) + "}"
    raise TypeError(type(v))


# ---------------------------------------------------------------------------------------------
# The Rust types the arguments are read into (tests/key_vectors.rs), as conversions of the
# parsed JSON: what serde would hold after deserializing.


def f64(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError("not a number")
    return float(x)


def f32(x):
    # serde_json reads an f32 as an f64 rounded to f32; idem widens it exactly to f64.
    return struct.unpack("<f", struct.pack("<f", f64(x)))[0]


def integer(lo, hi):
    def conv(x):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise TypeError("not an integer in range")
        return x

    return conv


u32, u64 = integer(0, 2**32 - 1), integer(0, 2**64 - 1)
i16, i64, i128 = integer(-(2**15), 2**15 - 1), integer(-(2**63), 2**63 - 1), integer(-(2**127), 2**127 - 1)


def string(x):
    if not isinstance(x, str):
        raise TypeError("not a string")
    return x


def optional(conv):
    return lambda x: None if x is None else conv(x)


def struct_of(**fields):
    """A Rust struct: every field is written, in any order (sorting makes order irrelevant).
    A field given as (conv, default) may be missing from the input."""

    def conv(obj):
        if not isinstance(obj, dict) or set(obj) - set(fields):
            raise TypeError("unexpected fields")
        out = {}
        for name, spec in fields.items():
            conv_, default = spec if isinstance(spec, tuple) else (spec, KeyError)
            if name in obj:
                out[name] = conv_(obj[name])
            elif default is KeyError:
                raise TypeError("missing field " + name)
            else:
                out[name] = default
        return out

    return conv


def json_value(x):
    """serde_json::Value: integers within i64/u64 stay exact, other integers become f64."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x if -(2**63) <= x < 2**64 else float(x)
    if isinstance(x, float):
        return x
    if isinstance(x, list):
        return [json_value(y) for y in x]
    return {k: json_value(y) for k, y in x.items()}


def op(x):
    # enum Op { Stop, Refund(u32), Move(i16, i16), Charge { cents: u64, note: Option<String> } },
    # externally tagged.
    if x == "Stop":
        return x
    (tag, body), = x.items()
    if tag == "Refund":
        return {tag: u32(body)}
    if tag == "Move":
        a, b = body
        return {tag: [i16(a), i16(b)]}
    if tag == "Charge":
        return {tag: struct_of(cents=u64, note=(optional(string), None))(body)}
    raise TypeError("unknown variant")


SHAPES = {
    "serde_json::Value": json_value,
    "Charge { customer: String, amount: f64, currency: String, "
    "#[serde(default)] metadata: BTreeMap<String, String> }": struct_of(
        customer=string, amount=f64, currency=string,
        metadata=(lambda m: {string(k): string(v) for k, v in m.items()}, {}),
    ),
    "Lookup { id: u64 }": struct_of(id=u64),
    "Transfer { from: i64, to: i64, cents: i128, note: Option<String> }": struct_of(
        **{"from": i64, "to": i64, "cents": i128, "note": (optional(string), None)}
    ),
    "Ratio { ratio: f32 }": struct_of(ratio=f32),
    "Vec<Op>": lambda xs: [op(x) for x in xs],
    "Samples { values: Vec<f64> }": struct_of(values=lambda xs: [f64(x) for x in xs]),
}



def params(decl: str):
    """The arguments of a `#[tool]` fn, declared as its parameter list `(a: String, b: u64)`: a
    JSON object with one member per parameter. A parameter marked `#[idem(skip)]` must be sent
    but is not part of the intent, so it is left out of the canonical text; one marked
    `#[idem(skip_if_none)]` (an `Option`) is left out when it is missing or `null`. A missing
    `Option` that is not marked is `null`."""
    types = {"String": string, "u64": u64, "i64": i64}
    fields, skipped, if_none = {}, set(), set()
    for part in filter(None, (p.strip() for p in decl.strip("()").split(","))):
        marker = next((m for m in ("skip", "skip_if_none") if part.startswith(f"#[idem({m})]")), None)
        name, ty = part.removeprefix(f"#[idem({marker})]").strip().split(": ")
        if ty.startswith("Option<"):
            inner = types[ty.removeprefix("Option<").removesuffix(">")]
            fields[name] = (lambda v, inner=inner: None if v is None else inner(v), None)
        else:
            fields[name] = types[ty]
        if marker == "skip":
            skipped.add(name)
        elif marker == "skip_if_none":
            if_none.add(name)
    read = struct_of(**fields)

    def conv(obj):
        return {
            k: v
            for k, v in read(obj).items()
            if k not in skipped and not (k in if_none and v is None)
        }

    return conv


def tool_name(fn: str, name_attr):
    """`#[tool]`'s naming rule: `name = ".."` when given, else the fn's name without `r#`."""
    return name_attr if name_attr is not None else fn.removeprefix("r#")


CHARGE = next(s for s in SHAPES if s.startswith("Charge"))
TRANSFER = next(s for s in SHAPES if s.startswith("Transfer"))

# ---------------------------------------------------------------------------------------------
# Keys.


def frame(b: bytes) -> bytes:
    return len(b).to_bytes(8, "big") + b


def framed(tag: bytes, *fields: bytes) -> str:
    return hashlib.sha256(frame(tag) + b"".join(frame(f) for f in fields)).hexdigest()


def derive_key(tenant, run, tool, canon: bytes) -> str:
    return framed(KEY_TAG, tenant.encode(), run.encode(), tool.encode(), canon)


def caller_key(tenant, run, tool, key) -> str:
    return framed(CALLER_KEY_TAG, tenant.encode(), run.encode(), tool.encode(), key.encode())


def fingerprint(canon: bytes) -> str:
    return framed(FINGERPRINT_TAG, canon)


# ---------------------------------------------------------------------------------------------
# The vectors: (name, tenant, run, tool, shape, arguments as JSON text).

KEYED = [
    ("charge", "", "run-1", "charge_card", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("charge, amount written 4900.0: same key as `charge`", "", "run-1", "charge_card", CHARGE,
     '{"customer":"cus_1","amount":4900.0,"currency":"eur"}'),
    ("charge, members permuted and spaced: same key as `charge`", "", "run-1", "charge_card", CHARGE,
     '{ "currency": "eur", "amount": 4.9e3, "customer": "cus_1", "metadata": {} }'),
    ("charge in another run", "", "run-2", "charge_card", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("charge for a tenant", "acme", "run-1", "charge_card", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("charge by another tool", "", "run-1", "refund", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("charge with escaped unicode and metadata", "", "run-1", "charge_card", CHARGE,
     r'{"customer":"caf\u00e9 \ud83d\ude00","amount":49.95,"currency":"eur",'
     r'"metadata":{"z":"1","\u00e9":"2","a":"\u0001\t\"\\/"}}'),
    ("charge with the same text raw: same key as the escaped one", "", "run-1", "charge_card", CHARGE,
     '{"customer":"café 😀","amount":49.95,"currency":"eur",'
     '"metadata":{"a":"\\u0001\\t\\"\\\\/","é":"2","z":"1"}}'),
    ("framing: tenant `a:b`, run `c`", "a:b", "c", "t", "serde_json::Value", "{}"),
    ("framing: tenant `a`, run `b:c`", "a", "b:c", "t", "serde_json::Value", "{}"),
    ("u64 id 2^53 + 1", "", "run-1", "lookup", "Lookup { id: u64 }", '{"id":9007199254740993}'),
    ("u64 id 2^53 exactly", "", "run-1", "lookup", "Lookup { id: u64 }", '{"id":9007199254740992}'),
    ("u64 id max", "", "run-1", "lookup", "Lookup { id: u64 }", '{"id":18446744073709551615}'),
    ("i128 and i64 extremes", "", "run-1", "transfer", TRANSFER,
     '{"from":-9223372036854775808,"to":9223372036854775807,'
     '"cents":-170141183460469231731687303715884105728}'),
    ("f32 widened exactly", "", "run-1", "scale", "Ratio { ratio: f32 }", '{"ratio":0.1}'),
    ("enum variants, externally tagged", "", "run-1", "ops", "Vec<Op>",
     '["Stop",{"Refund":5},{"Move":[-1,2]},{"Charge":{"note":null,"cents":100}},{"Charge":{"cents":1}}]'),
    ("ECMAScript number forms", "", "run-1", "measure", "Samples { values: Vec<f64> }",
     '{"values":[1e21,1e20,1e-7,0.000001,0.1,-0.0,5e-324,1.7976931348623157e308,'
     '123456789.125,-1.5e-10,4.4867444887722390e-176,333333333.33333325,9007199254740993]}'),
    ("member order by UTF-16 code units", "", "run-1", "tag", "serde_json::Value",
     '{"z":1,"\\u00e9":2,"\\ud83d\\ude00":3,"\\uff61":4,"a":5,"":6,"\\r":7,"\\u0080":8,"aa":9}'),
    ("untyped numbers: exact within i64/u64, f64 beyond", "", "run-1", "tag", "serde_json::Value",
     '{"u":18446744073709551615,"i":-9223372036854775808,"big":18446744073709551616,'
     '"f":1.0,"e":2E-3,"neg0":-0}'),
    ("nested arrays and empty containers", "", "", "t", "serde_json::Value",
     '[[],{},"",[null,true,false,[{"b":[],"a":{}}]]]'),
    # Strings are compared as written, never Unicode-normalised: two spellings of "é" are two
    # intents.
    ("NFC \"é\" (U+00E9)", "", "run-1", "tag", "serde_json::Value", '{"name":"caf\\u00e9"}'),
    ("NFD \"é\" (e + U+0301): not the same key as NFC", "", "run-1", "tag", "serde_json::Value",
     '{"name":"cafe\\u0301"}'),
]

# Tools declared with `#[tool]` in tests/tool_key_vectors.rs: (name, fn, `name = ..` or None,
# declaration, run, parameters, arguments). The tool name comes from `tool_name`.
TOOLS = [
    ("free fn: the tool is named after the fn", "charge_card", None,
     '#[tool(retry = "keyed")] async fn charge_card(customer: String, amount_cents: u64)',
     "run-1", "(customer: String, amount_cents: u64)", '{"customer":"cus_1","amount_cents":4900}'),
    ("free fn with `name = \"refund-v2\"`", "refund", "refund-v2",
     '#[tool(retry = "keyed", name = "refund-v2")] async fn refund(charge: String, amount_cents: u64)',
     "run-1", "(charge: String, amount_cents: u64)", '{"charge":"ch_1","amount_cents":100}'),
    ("raw identifier: `r#move` is the tool `move`", "r#move", None,
     '#[tool(retry = "never")] async fn r#move(from: i64, to: i64)',
     "run-1", "(from: i64, to: i64)", '{"to":-2,"from":1}'),
    ("method: named after the method", "post_entry", None,
     '#[tool(retry = "keyed")] async fn post_entry(&self, account: String, cents: i64)',
     "run-1", "(account: String, cents: i64)", '{"account":"acct_1","cents":-500}'),
    ("method with `name = \"ledger_balance\"`", "balance", "ledger_balance",
     '#[tool(retry = "safe", name = "ledger_balance")] async fn balance(&self, account: String)',
     "run-2", "(account: String)", '{"account":"acct_1"}'),
    ("a skipped parameter is not part of the key", "send_email", None,
     '#[tool(retry = "keyed")] async fn send_email(to: String, body: String, #[idem(skip)] trace_id: String)',
     "run-1", "(to: String, body: String, #[idem(skip)] trace_id: String)",
     '{"to":"a@example.com","body":"hi","trace_id":"t-1"}'),
    ("an optional parameter skipped when none: absent, the key of the tool without it",
     "open_ticket", None,
     '#[tool(retry = "keyed")] async fn open_ticket(title: String, #[idem(skip_if_none)] memo: Option<String>)',
     "run-1", "(title: String, #[idem(skip_if_none)] memo: Option<String>)", '{"title":"printer"}'),
    ("an optional parameter skipped when none: null, the same key", "open_ticket", None,
     '#[tool(retry = "keyed")] async fn open_ticket(title: String, #[idem(skip_if_none)] memo: Option<String>)',
     "run-1", "(title: String, #[idem(skip_if_none)] memo: Option<String>)",
     '{"title":"printer","memo":null}'),
    ("an optional parameter skipped when none: given, part of the key", "open_ticket", None,
     '#[tool(retry = "keyed")] async fn open_ticket(title: String, #[idem(skip_if_none)] memo: Option<String>)',
     "run-1", "(title: String, #[idem(skip_if_none)] memo: Option<String>)",
     '{"title":"printer","memo":"urgent"}'),
    ("the same tool before the optional parameter was added: the key of the first two",
     "open_ticket_v1", "open_ticket",
     '#[tool(retry = "keyed", name = "open_ticket")] async fn open_ticket_v1(title: String)',
     "run-1", "(title: String)", '{"title":"printer"}'),
    ("an optional parameter not marked: a missing one is null, another key", "open_ticket_unmarked",
     "open_ticket",
     '#[tool(retry = "keyed", name = "open_ticket")] async fn open_ticket_unmarked(title: String, memo: Option<String>)',
     "run-1", "(title: String, memo: Option<String>)", '{"title":"printer"}'),
    ("no parameters", "ping", None, '#[tool(retry = "safe")] async fn ping()', "run-1", "()", "{}"),
]

CALLER = [
    ("caller key", "", "run-1", "charge_card", "order-7", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("caller key reused with other arguments: same key, other fingerprint", "", "run-1", "charge_card",
     "order-7", CHARGE, '{"customer":"cus_1","amount":4901,"currency":"eur"}'),
    ("caller key for a tenant", "acme", "run-1", "charge_card", "order-7", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
    ("caller key with non-ASCII text", "", "run-1", "charge_card", "commande-é-😀", CHARGE,
     '{"customer":"cus_1","amount":4900,"currency":"eur"}'),
]


def read_json(text):
    """JSON text as idem reads arguments: Python's json module would take NaN and Infinity, keep
    the last of two members with one name, and pass a lone surrogate escape on; idem refuses
    all three (docs/key-spec.md), so the reference does too."""

    def unique(pairs):
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError("an object names a member twice (RFC 8785 §3.1)")
        return dict(pairs)

    def no_constant(name):
        raise ValueError(f"JSON has no {name}")

    value = json.loads(text, object_pairs_hook=unique, parse_constant=no_constant)
    canonical(value).encode("utf-8")  # a lone surrogate cannot be encoded
    return value


def build():
    def common(shape, args_json):
        canon = canonical(SHAPES[shape](read_json(args_json)))
        return canon, fingerprint(canon.encode())

    keyed = []
    for name, tenant, run, tool, shape, args in KEYED:
        canon, fp = common(shape, args)
        keyed.append({
            "name": name, "tenant": tenant, "run": run, "tool": tool, "type": shape,
            "arguments": args, "canonical": canon,
            "key": derive_key(tenant, run, tool, canon.encode()), "fingerprint": fp,
        })
    caller = []
    for name, tenant, run, tool, key, shape, args in CALLER:
        canon, fp = common(shape, args)
        caller.append({
            "name": name, "tenant": tenant, "run": run, "tool": tool, "caller_key": key,
            "type": shape, "arguments": args, "canonical": canon,
            "key": caller_key(tenant, run, tool, key), "fingerprint": fp,
        })
    tools = []
    for name, fn, name_attr, declaration, run, decl, args in TOOLS:
        canon = canonical(params(decl)(read_json(args)))
        tool = tool_name(fn, name_attr)
        tools.append({
            "name": name, "declaration": declaration, "fn": fn, "tool": tool, "tenant": "",
            "run": run, "arguments": args, "canonical": canon,
            "key": derive_key("", run, tool, canon.encode()),
        })
    return {
        "about": "idem key derivation test vectors; see docs/key-spec.md. Generated by "
                 "docs/key_vectors.py (independent of the Rust code), checked by "
                 "tests/key_vectors.rs and, through #[tool], tests/tool_key_vectors.rs.",
        "keys": keyed,
        "caller_keys": caller,
        "tools": tools,
    }


def main():
    if sys.argv[1:] not in ([], ["--check"]):
        sys.exit(__doc__)
    path = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "keys.json"
    text = json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
    if "--check" in sys.argv:
        if path.read_text(encoding="utf-8") != text:
            sys.exit(f"{path} differs from the reference computation")
        print(f"{path}: ok")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
