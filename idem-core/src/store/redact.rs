//! Store URLs as errors show them: without the password. An error that repeats a mistyped URL
//! (an unknown scheme, a connection string that does not parse) is printed by the CLI and logged
//! by applications, and a password in it would land in terminals, logs and bug reports.

use std::borrow::Cow;

/// What replaces a password.
const MASK: &str = "***";

/// A store URL or connection string kept for later use, whose `Debug` is [`redacted`]: a type
/// holding one derives `Debug` and prints no password, whatever fields it gains.
#[cfg(any(feature = "redis", feature = "postgres"))]
#[derive(Clone)]
pub(crate) struct SecretUrl(String);

#[cfg(any(feature = "redis", feature = "postgres"))]
impl SecretUrl {
    pub(crate) fn new(url: impl Into<String>) -> SecretUrl {
        SecretUrl(url.into())
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
impl std::ops::Deref for SecretUrl {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

#[cfg(any(feature = "redis", feature = "postgres"))]
impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&redacted(&self.0), f)
    }
}

/// `url` with its password masked: the part of a URL's user info after `:` (`postgres://app:***@db`,
/// also in a URL whose scheme is mistyped, cut short or missing, as `redis:/:***@host` or
/// `app:***@db`), and the value of every `password` pair (a libpq key=value string, spaces around
/// `=` allowed; a URL query), quoted or not, backslash escapes included, to its end (a space,
/// `&`, or the closing quote; the rest of the text when a quote is not closed). Errs on the side
/// of masking: an `@` later in the text (a query) masks more than the password.
pub fn redacted(url: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(url);
    if let Some(masked) = user_info_masked(&out) {
        out = Cow::Owned(masked);
    }
    if let Some(masked) = password_pairs_masked(&out) {
        out = Cow::Owned(masked);
    }
    out
}

/// `text`, a connection string that did not parse, with everything from its first password's
/// value to its end masked: where the text is malformed, where a password ends cannot be told (a
/// space or a quote inside it), so nothing after its start is shown. A URL's user info is masked
/// as by [`redacted`] (to the last `@`, whatever it holds).
#[cfg(feature = "postgres")]
pub(crate) fn redacted_unparsed(text: &str) -> Cow<'_, str> {
    let masked = redacted(text);
    match next_password_value(&masked.to_ascii_lowercase(), masked.as_bytes(), 0) {
        Some(value) => Cow::Owned(format!("{}{MASK} (the rest is not shown)", &masked[..value])),
        None => masked,
    }
}

/// The user info `user:password@` before the last `@`, its password masked. Without `://` the
/// text from its start (or from a leading `//`) is taken for the user info, so a scheme that is
/// cut short or missing does not hide a password.
fn user_info_masked(url: &str) -> Option<String> {
    // A `://` counts only after a scheme: one later in the text (a query naming a file URL, in
    // a URL whose scheme is missing) is not where the user info starts.
    let scheme = |i: usize| {
        let s = url[..i].trim_start();
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    };
    let start = url.find("://").filter(|&i| scheme(i)).map(|i| i + 3).unwrap_or_else(|| {
        let trimmed = url.trim_start();
        let lead = url.len() - trimmed.len();
        lead + if trimmed.starts_with("//") { 2 } else { 0 }
    });
    let at = start + url[start..].rfind('@')?;
    let colon = start + url[start..at].find(':')?;
    Some(format!("{}{MASK}{}", &url[..=colon], &url[at..]))
}

/// Where the value of the next `password` pair (`password=`, `password = `, any case) or `pass`
/// pair (the password option of a Redis socket URL, `redis+unix:///s.sock?pass=`) at or after
/// `from` starts. `lower` is the text in ASCII lower case, `bytes` the text's.
fn next_password_value(lower: &str, bytes: &[u8], mut from: usize) -> Option<usize> {
    const NAME: &str = "pass";
    loop {
        let found = lower[from..].find(NAME)?;
        let mut i = from + found + NAME.len();
        if lower[i..].starts_with("word") {
            i += "word".len();
        }
        from = i;
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if bytes.get(i) != Some(&b'=') {
            continue;
        }
        i += 1;
        while bytes.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        return Some(i);
    }
}

/// The values of `password` and `pass` pairs ([`next_password_value`]) masked.
fn password_pairs_masked(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    let bytes = text.as_bytes();
    let mut out = String::new();
    let (mut copied, mut from) = (0, 0);
    while let Some(mut i) = next_password_value(&lower, bytes, from) {
        let value = i;
        let end = if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => break text.len(),
                    Some(b'\\') => i += 2,
                    Some(b'\'') => break i + 1,
                    Some(_) => i += 1,
                }
            }
        } else {
            loop {
                match bytes.get(i) {
                    None => break text.len(),
                    Some(b'\\') => i += 2,
                    Some(b) if b.is_ascii_whitespace() || *b == b'&' => break i,
                    Some(_) => i += 1,
                }
            }
        }
        .min(text.len());
        out.push_str(&text[copied..value]);
        out.push_str(MASK);
        copied = end;
        from = end.max(value);
    }
    if copied == 0 && out.is_empty() {
        return None;
    }
    out.push_str(&text[copied..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn passwords_are_masked_wherever_a_url_or_connection_string_holds_one() {
        let cases = [
            ("postgress://app:s3cretPW@db.example/app", "postgress://app:***@db.example/app"),
            ("redis:/:s3cretPW@127.0.0.1:6379/", "redis:***@127.0.0.1:6379/"),
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
            ("app:s3cretPW@db/x", "app:***@db/x"),
            ("//app:s3cretPW@db/x", "//app:***@db/x"),
            ("redis:s3cretPW@host", "redis:***@host"),
            ("host=h password = s3cretPW dbname=test", "host=h password = *** dbname=test"),
            ("host=h password\t=\ts3cretPW", "host=h password\t=\t***"),
            ("host=h password=s3cret\\ PW dbname=test", "host=h password=*** dbname=test"),
            ("host=h password='s3cret\\' PW' x=y", "host=h password=*** x=y"),
            ("sslpassword=s3cretPW", "sslpassword=***"),
            ("redis+unx:///run/r.sock?db=0&pass=s3cretPW", "redis+unx:///run/r.sock?db=0&pass=***"),
            ("unix:/r.sock?pass=s3cretPW&x=1", "unix:/r.sock?pass=***&x=1"),
            ("app:s3cretPW@db/x?ca=file:///ca.pem", "app:***@db/x?ca=file:///ca.pem"),
        ];
        for (url, shown) in cases {
            assert_eq!(redacted(url), shown, "{url}");
            assert!(!redacted(url).contains("s3cret"), "{url}");
        }
        // Nothing to mask: the text as it is.
        for url in [
            "sqlite:///home/me@work/a.db",
            "redis://host:6379/",
            "host=h dbname=d",
            "",
            "password",
            "host=h passfile=/home/me/.pgpass",
        ] {
            assert_eq!(redacted(url), url);
        }
    }
}
