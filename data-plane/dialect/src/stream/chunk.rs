//! An OpenAI stream chunk, read without building a JSON tree: the fields
//! the decoder needs, borrowed from the event's text when they have no
//! escapes. Lenient where servers differ: a text field of another type
//! (some servers put an object in `reasoning`) reads as absent, as does
//! an index that is not a count; unknown fields are skipped.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// A string, or absent when the field holds anything else.
#[derive(Debug, Default)]
pub(super) struct Text<'a>(pub(super) Option<Cow<'a, str>>);

/// A count, or absent when the field holds anything else.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Count(pub(super) Option<u64>);

struct Lenient<T>(std::marker::PhantomData<T>);

macro_rules! skip_others {
    () => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

impl<'de> Visitor<'de> for Lenient<Text<'de>> {
    type Value = Text<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Borrowed(s))))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(s.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(s))))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Text(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Text(None))
    }
    skip_others!();
}

impl<'de> Visitor<'de> for Lenient<Count> {
    type Value = Count;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Count(Some(n)))
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Count(u64::try_from(n).ok()))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Count(None))
    }
    skip_others!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Text<'de>>(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Lenient::<Count>(std::marker::PhantomData))
    }
}

/// One chunk.
#[derive(Debug, Deserialize)]
pub(super) struct Chunk<'a> {
    #[serde(borrow, default)]
    pub(super) id: Text<'a>,
    #[serde(borrow, default)]
    pub(super) model: Text<'a>,
    #[serde(borrow, default)]
    pub(super) choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    pub(super) usage: Option<Value>,
    #[serde(default)]
    pub(super) error: Option<Value>,
}

/// One choice of a chunk.
#[derive(Debug, Deserialize)]
pub(super) struct Choice<'a> {
    #[serde(default)]
    pub(super) index: Count,
    #[serde(borrow, default)]
    pub(super) delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub(super) finish_reason: Text<'a>,
}

/// A choice's delta.
#[derive(Debug, Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(borrow, default)]
    pub(super) content: Text<'a>,
    #[serde(borrow, default)]
    pub(super) refusal: Text<'a>,
    #[serde(borrow, default)]
    pub(super) reasoning_content: Text<'a>,
    #[serde(borrow, default)]
    pub(super) reasoning: Text<'a>,
    #[serde(borrow, default)]
    pub(super) tool_calls: Option<Vec<ToolCall<'a>>>,
}

/// A tool call's delta.
#[derive(Debug, Deserialize)]
pub(super) struct ToolCall<'a> {
    #[serde(default)]
    pub(super) index: Count,
    #[serde(borrow, default)]
    pub(super) id: Text<'a>,
    #[serde(borrow, default)]
    pub(super) function: Option<Function<'a>>,
}

/// A tool call's function delta.
#[derive(Debug, Deserialize)]
pub(super) struct Function<'a> {
    #[serde(borrow, default)]
    pub(super) name: Text<'a>,
    #[serde(borrow, default)]
    pub(super) arguments: Text<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_another_type_read_as_absent_and_text_is_borrowed() {
        let c: Chunk<'_> = serde_json::from_str(
            r#"{"id":"x","model":7,"choices":[{"index":"0","delta":{"content":"hi","reasoning":{"a":[1,{"b":null}]},"refusal":true},"finish_reason":null}],"extra":[1,2]}"#,
        )
        .unwrap();
        assert!(matches!(c.id.0, Some(Cow::Borrowed("x"))));
        assert!(c.model.0.is_none());
        let choice = &c.choices.as_ref().unwrap()[0];
        assert!(choice.index.0.is_none());
        let d = choice.delta.as_ref().unwrap();
        assert_eq!(d.content.0.as_deref(), Some("hi"));
        assert!(d.reasoning.0.is_none() && d.refusal.0.is_none());
        let e: Chunk<'_> =
            serde_json::from_str(r#"{"choices":[{"delta":{"content":"a\"b"}}]}"#).unwrap();
        assert_eq!(
            e.choices.unwrap()[0]
                .delta
                .as_ref()
                .unwrap()
                .content
                .0
                .as_deref(),
            Some("a\"b")
        );
    }
}
