//! Store URLs as errors show them: without the password. An error that repeats a mistyped URL
//! (an unknown scheme, a connection string that does not parse) is printed by the CLI and logged
//! by applications, and a password in it would land in terminals, logs and bug reports.

use std::borrow::Cow;

/// What replaces a password.
const MASK: &str = "***";

/// `url` with its password masked: the part of a URL's user info after `:` (`postgres://app:***@db`,
/// also in a URL whose scheme is mistyped or cut short, as `redis:/:***@host`), and the value of
/// every `password=` pair (a libpq key=value string, a URL query), quoted or not, to its end
/// (a space, `&`, or the closing quote; the rest of the text when a quote is not closed).
pub(crate) fn redacted(url: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(url);
    if let Some(masked) = user_info_masked(&out) {
        out = Cow::Owned(masked);
    }
    if let Some(masked) = password_pairs_masked(&out) {
        out = Cow::Owned(masked);
    }
    out
}

/// The user info `user:password@` before the last `@` of the authority, its password masked.
fn user_info_masked(url: &str) -> Option<String> {
    // The authority starts after the scheme: after `://`, or after the first `:` of a URL
    // written with fewer slashes.
    let start = url.find("://").map(|i| i + 3).or_else(|| url.find(':').map(|i| i + 1))?;
    let at = start + url[start..].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some(format!("{}{MASK}{}", &url[..=colon], &url[at..]))
}

/// The values of `password=` pairs masked.
fn password_pairs_masked(text: &str) -> Option<String> {
    const NAME: &str = "password=";
    let lower = text.to_ascii_lowercase();
    if !lower.contains(NAME) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    let mut from = 0;
    while let Some(found) = lower[from..].find(NAME) {
        let value = from + found + NAME.len();
        let bytes = text.as_bytes();
        let end = match bytes.get(value) {
            Some(b'\'') => {
                // To the closing quote (a backslash escapes the next character), else the end.
                let mut i = value + 1;
                loop {
                    match bytes.get(i) {
                        None => break text.len(),
                        Some(b'\\') => i += 2,
                        Some(b'\'') => break i + 1,
                        Some(_) => i += 1,
                    }
                }
                .min(text.len())
            }
            _ => text[value..]
                .find(|c: char| c.is_whitespace() || c == '&')
                .map_or(text.len(), |i| value + i),
        };
        out.push_str(&text[rest..value]);
        out.push_str(MASK);
        rest = end;
        from = end.max(value);
    }
    out.push_str(&text[rest..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_are_masked_wherever_a_url_or_connection_string_holds_one() {
        let cases = [
            ("postgress://app:s3cretPW@db.example/app", "postgress://app:***@db.example/app"),
            ("redis:/:s3cretPW@127.0.0.1:6379/", "redis:/:***@127.0.0.1:6379/"),
            ("memory://u:s3cretPW@x", "memory://u:***@x"),
            ("rediss://:p@ss@host:6380/0", "rediss://:***@host:6380/0"),
            ("host=127.0.0.1 password=s3cretPW dbname", "host=127.0.0.1 password=*** dbname"),
            ("host=h password='s3cret PW' dbname=test", "host=h password=*** dbname=test"),
            ("host=h password='s3cret PW dbname=test", "host=h password=***"),
            ("host=h PASSWORD=x\\", "host=h PASSWORD=***"),
            (
                "postgres://db/app?user=a&password=s3cret&sslmode=require",
                "postgres://db/app?user=a&password=***&sslmode=require",
            ),
            ("password=", "password=***"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("s3cret"), "{url}");
        }
        // Nothing to mask: the text as it is.
        for url in ["sqlite:///home/me@work/a.db", "redis://host:6379/", "host=h dbname=d", ""] {
            assert_eq!(redacted(url), url);
        }
    }
}
