//! Each store's record decoder on bytes someone with write access to the store could plant:
//! the Redis claim script's reply (RESP, as it arrives) and its completed-record string, and the
//! SQL stores' outcome columns. Never a panic; a record either decodes to something this version
//! writes or is refused as incompatible.

#![no_main]

use idem_core::Fingerprint;
use idem_core::store::redis::{decode_answer, decode_record};
use idem_core::store::{Claim, Outcome, StoreError, decode_sql_outcome};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((pick, rest)) = data.split_first() else { return };
    match pick % 3 {
        0 => {
            if let Ok(reply) = redis::parse_redis_value(rest) {
                let _ = decode_answer(reply);
            }
        }
        1 => {
            // The fingerprint of the intent asking; a record of another one is a mismatch.
            let asking = Fingerprint::parse(&"ab".repeat(32));
            let Some(asking) = asking else { return };
            match decode_record("P:{k}", rest, &asking) {
                Ok(Claim::Completed(record)) => {
                    assert_eq!(record.fingerprint, asking);
                    let text = String::from_utf8_lossy(rest);
                    assert!(text.starts_with("2|d|"), "{text}");
                }
                Ok(Claim::Mismatch) | Err(StoreError::Incompatible(_)) => {}
                Ok(other) => panic!("a stored record decoded as {other:?}"),
                Err(e) => panic!("decoding is not a store failure: {e}"),
            }
        }
        _ => {
            let (kind, payload) = rest.split_at(rest.len().min(1));
            let kind = kind.first().map(|k| i64::from(*k) - 1);
            let payload = std::str::from_utf8(payload).ok().map(str::to_owned);
            match decode_sql_outcome(kind, payload.clone()) {
                Some(Outcome::Success(p) | Outcome::Failure(p) | Outcome::NotStorable(p)) => {
                    assert_eq!(Some(p), payload)
                }
                Some(Outcome::Unknown) => assert_eq!(payload, None),
                None => {}
            }
        }
    }
});
