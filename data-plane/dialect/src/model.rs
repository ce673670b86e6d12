//! The neutral model: what a request, an answer and a stream event say,
//! whatever dialect they came in.
//!
//! It is the hub every translation passes through (n dialects need 2n
//! adapters, not n²). It holds what the three dialects share, in the
//! richest of their shapes:
//!
//! - a **system** prompt as text blocks (Anthropic's shape: several blocks,
//!   each with its own `cache_control`); OpenAI's leading `system` and
//!   `developer` messages and Gemini's `systemInstruction` land here;
//! - **messages** of a role and content [`Part`]s. A tool's result is a
//!   part of a *user* message (Anthropic's and Gemini's shape); OpenAI's
//!   `tool` messages become user messages holding one
//!   [`Part::ToolResult`] each and are written back as `tool` messages;
//! - a tool call's **arguments as JSON text** ([`Part::ToolUse::input`]):
//!   OpenAI carries them as a string, Anthropic and Gemini as an object.
//!   Text is the only form that is exact in both directions (a stream
//!   carries them in fragments, and a model may emit arguments that are
//!   not valid JSON, which must reach the client as they are);
//! - **usage** normalized to four counts that never overlap
//!   ([`Usage`](crate::Usage));
//! - fields the model does not know are kept in `extra` with the dialect
//!   they came from: written back unchanged to the same dialect, and
//!   reported as [`Uncarried`](crate::Uncarried) to any other.

use serde_json::{Map, Value};

use crate::Dialect;

/// A request, in no dialect.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    /// The dialect it was parsed from (for `extra` and [`Part::Other`]).
    pub origin: Dialect,
    /// The model asked for (Gemini carries it in the URL, not the body).
    pub model: Option<String>,
    /// The system prompt.
    pub system: Vec<TextBlock>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    pub tools: Vec<Tool>,
    /// Whether and which tool the model must call.
    pub tool_choice: Option<ToolChoice>,
    /// `false` asks for at most one tool call per answer.
    pub parallel_tool_calls: Option<bool>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling (Anthropic, Gemini).
    pub top_k: Option<u64>,
    /// Sampling seed (OpenAI, Gemini).
    pub seed: Option<i64>,
    /// Presence penalty (OpenAI, Gemini).
    pub presence_penalty: Option<f64>,
    /// Frequency penalty (OpenAI, Gemini).
    pub frequency_penalty: Option<f64>,
    /// Extended thinking / reasoning.
    pub reasoning: Option<Reasoning>,
    /// The end user's id (OpenAI `user`, Anthropic `metadata.user_id`).
    pub user: Option<String>,
    /// A streamed answer was asked for.
    pub stream: bool,
    /// The client asked for a final usage chunk in its stream (OpenAI
    /// `stream_options.include_usage`). Upstream, the router always asks.
    pub stream_usage: bool,
    /// The answer's format (JSON mode, a JSON schema).
    pub response_format: Option<ResponseFormat>,
    /// Which OpenAI field carried the token limit (kept so that an OpenAI
    /// request written back to OpenAI uses the same one).
    pub openai_max_tokens_field: Option<MaxTokensField>,
    /// Fields of `origin` the model does not know, by name.
    pub extra: Map<String, Value>,
}

/// Which OpenAI field carries the token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensField {
    /// `max_tokens`: understood by every OpenAI-compatible server.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require.
    MaxCompletionTokens,
}

/// A text block of the system prompt.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TextBlock {
    /// The text.
    pub text: String,
    /// Anthropic's prompt-cache breakpoint, as given.
    pub cache_control: Option<Value>,
}

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The user (and tool results).
    User,
    /// The model.
    Assistant,
    /// A system message that is not at the start of the conversation
    /// (OpenAI only; the leading ones are [`Request::system`]).
    System,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Who says it.
    pub role: Role,
    /// What it says.
    pub content: Vec<Part>,
    /// OpenAI's participant `name`.
    pub name: Option<String>,
    /// Fields of the request's `origin` the model does not know.
    pub extra: Map<String, Value>,
    /// Its index in the client's `messages` (or `contents`), for the paths
    /// of errors and uncarried fields (OpenAI's leading system messages
    /// are not messages here).
    pub source_index: Option<usize>,
}

impl Message {
    /// A message of parts, without name or extra fields.
    pub fn new(role: Role, content: Vec<Part>) -> Self {
        Self {
            role,
            content,
            name: None,
            extra: Map::new(),
            source_index: None,
        }
    }

    /// The path of this message (the `i`th here) in the client's request.
    pub(crate) fn path(&self, list: &str, i: usize) -> String {
        format!("{list}[{}]", self.source_index.unwrap_or(i))
    }
}

/// One piece of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text {
        /// The text.
        text: String,
        /// Anthropic's prompt-cache breakpoint.
        cache_control: Option<Value>,
    },
    /// An image.
    Image {
        /// Where its bytes are.
        source: ImageSource,
        /// OpenAI's `detail` (`low`, `high`, `auto`).
        detail: Option<String>,
        /// Anthropic's prompt-cache breakpoint.
        cache_control: Option<Value>,
    },
    /// The model calls a tool.
    ToolUse {
        /// The call's id, as the client sees it (a Gemini thought
        /// signature rides in it: see [`crate::gemini`]).
        id: String,
        /// The tool's name.
        name: String,
        /// The arguments, as JSON text.
        input: String,
        /// Gemini's `thoughtSignature` of this call.
        signature: Option<String>,
        /// Anthropic's prompt-cache breakpoint.
        cache_control: Option<Value>,
    },
    /// A tool's result, for the call `tool_use_id`.
    ToolResult {
        /// The call it answers.
        tool_use_id: String,
        /// What the tool returned (text and images).
        content: Vec<Part>,
        /// The tool failed.
        is_error: bool,
        /// Anthropic's prompt-cache breakpoint.
        cache_control: Option<Value>,
    },
    /// The model's reasoning.
    Thinking {
        /// Its text (a summary, for some models).
        text: String,
        /// Anthropic's signature of the block; `None` or empty for
        /// reasoning that came from another provider.
        signature: Option<String>,
    },
    /// Anthropic's encrypted reasoning.
    RedactedThinking {
        /// The opaque data.
        data: String,
    },
    /// A part this model does not know, kept as it came, for the same
    /// dialect.
    Other {
        /// Its dialect.
        dialect: Dialect,
        /// The part as it came.
        value: Value,
    },
}

impl Part {
    /// A text part without a cache breakpoint.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text {
            text: text.into(),
            cache_control: None,
        }
    }
}

/// Where an image's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Inline, base64-encoded.
    Base64 {
        /// Its MIME type (`image/png`).
        media_type: String,
        /// The base64 text.
        data: String,
    },
    /// At a URL the provider fetches.
    Url(String),
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub enum Tool {
    /// A function the client runs.
    Function {
        /// Its name.
        name: String,
        /// What it does.
        description: Option<String>,
        /// Its arguments' JSON Schema (`null` when the client gave none).
        parameters: Value,
        /// OpenAI's `strict` (constrained decoding to the schema).
        strict: Option<bool>,
        /// Anthropic's prompt-cache breakpoint.
        cache_control: Option<Value>,
    },
    /// A tool of one dialect only (Anthropic's server tools, OpenAI's
    /// custom tools), kept as it came.
    Other {
        /// Its dialect.
        dialect: Dialect,
        /// The tool as it came.
        value: Value,
    },
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool call.
    None,
    /// Some tool call (OpenAI `required`, Anthropic `any`, Gemini `ANY`).
    Required,
    /// This tool.
    Tool(String),
}

/// Extended thinking / reasoning, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reasoning {
    /// Thinking off (Anthropic `disabled`).
    Off,
    /// Thinking with a token budget (Anthropic `budget_tokens`, Gemini
    /// `thinkingBudget`).
    Budget(u64),
    /// Thinking at an effort word (OpenAI `reasoning_effort`, Gemini
    /// `thinkingLevel`).
    Effort(String),
    /// The model decides how much (Anthropic `adaptive`, Gemini
    /// `thinkingBudget: -1`).
    Adaptive,
}

/// The answer's format.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// Some JSON object.
    JsonObject,
    /// JSON matching a schema.
    JsonSchema {
        /// The schema's name (OpenAI requires one).
        name: String,
        /// The schema.
        schema: Value,
        /// OpenAI's `strict`.
        strict: Option<bool>,
    },
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// It finished its turn (OpenAI `stop`, Anthropic `end_turn`, Gemini
    /// `STOP`).
    EndTurn,
    /// It hit the token limit (`length`, `max_tokens`, `MAX_TOKENS`).
    MaxTokens,
    /// It produced a stop sequence.
    StopSequence,
    /// It called tools (`tool_calls`, `tool_use`).
    ToolUse,
    /// It refused or its output was filtered (`content_filter`, `refusal`,
    /// Gemini `SAFETY` and the other blocking reasons).
    Refusal,
    /// Anthropic's `pause_turn` (a long server-tool turn paused).
    PauseTurn,
    /// The context window was full (Anthropic
    /// `model_context_window_exceeded`).
    ContextWindow,
    /// The model produced a malformed tool call (Gemini
    /// `MALFORMED_FUNCTION_CALL` and kin).
    ToolError,
    /// A reason this crate does not know.
    Other,
}

/// A whole (unstreamed) answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The provider's id for it.
    pub id: String,
    /// The model that answered.
    pub model: String,
    /// What the model said.
    pub content: Vec<Part>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The stop sequence produced, when known (Anthropic only).
    pub stop_sequence: Option<String>,
    /// Tokens counted.
    pub usage: crate::Usage,
}
