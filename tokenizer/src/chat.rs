//! Chat templates: the model's own Jinja template from GGUF metadata
//! (`tokenizer.chat_template`), rendered with minijinja as transformers and
//! llama-cpp-python render them (a sandbox with `trim_blocks` and `lstrip_blocks`,
//! Python's string and dict methods, `tojson`, `break`/`continue`, `raise_exception`
//! and `strftime_now`; checked on llama.cpp's own collection of real templates,
//! `tests/chat_templates.rs`). A model without a template falls back to its family's
//! format where the vocabulary names it (Gemma's turn tokens), else to ChatML.

use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;
use sharemesh_protocol::{ChatMessage, Role};

use crate::TokenizerError;

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turns (as in Google's template): no system role, so a system message is
/// prepended to the first user turn; the assistant is `model`.
const GEMMA: &str = "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}{% for message in turns %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' + (first if loop.first else '') + message['content'] + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}";

/// Which built-in template serves a model whose GGUF has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    ChatMl,
    Gemma,
}

impl Fallback {
    /// Gemma vocabularies carry `<start_of_turn>`; everything else gets ChatML.
    pub fn for_vocabulary(has_start_of_turn: bool) -> Self {
        if has_start_of_turn {
            Fallback::Gemma
        } else {
            Fallback::ChatMl
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// Whether the template shows a system message (Gemma 2's refuses one; some drop
    /// it): where it does not, system messages are merged into the next user turn.
    system_role: bool,
}

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: std::borrow::Cow<'a, str>,
}

/// llama.cpp's system-role polyfill (minja's `polyfill_system_role`), for templates
/// without a system role: system messages, joined by a line break, open the next user
/// message (a line break between), or become a user message of their own before an
/// assistant turn or at the end.
fn merge_system_turns(messages: &[ChatMessage]) -> Vec<TemplateMessage<'_>> {
    let mut merged = Vec::with_capacity(messages.len());
    let mut pending = String::new();
    let flush = |pending: &mut String, merged: &mut Vec<TemplateMessage<'_>>| {
        if !pending.is_empty() {
            merged.push(TemplateMessage {
                role: "user",
                content: std::mem::take(pending).into(),
            });
        }
    };
    for message in messages {
        match message.role {
            Role::System => {
                if !pending.is_empty() {
                    pending.push('\n');
                }
                pending.push_str(&message.content);
            }
            Role::User if !pending.is_empty() => {
                let mut content = std::mem::take(&mut pending);
                if !message.content.is_empty() {
                    content.push('\n');
                    content.push_str(&message.content);
                }
                merged.push(TemplateMessage {
                    role: "user",
                    content: content.into(),
                });
            }
            role => {
                flush(&mut pending, &mut merged);
                merged.push(TemplateMessage {
                    role: role_name(role),
                    content: message.content.as_str().into(),
                });
            }
        }
    }
    flush(&mut pending, &mut merged);
    merged
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// Template instructions one rendering may run: a model's template comes from its file
/// (a peer's header, for a buyer), so a loop that never ends is an error, not a hung
/// thread. Real templates render a long conversation in a few thousand.
pub const TEMPLATE_FUEL: u64 = 2_000_000;

impl ChatTemplate {
    /// `source` is the GGUF's template, if it has one.
    pub fn new(
        source: Option<String>,
        fallback: Fallback,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        // transformers' and llama.cpp's settings: a block tag's own line break and
        // indentation are not output (templates are written on many lines for this).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        let builtin = match fallback {
            Fallback::ChatMl => CHATML,
            Fallback::Gemma => GEMMA,
        };
        env.add_template_owned("chat", source.unwrap_or_else(|| builtin.to_owned()))
            .map_err(|e| TokenizerError::BadModel(format!("chat template does not parse: {e}")))?;
        let mut template = Self {
            env,
            bos_token,
            eos_token,
            system_role: true,
        };
        template.system_role = template.shows_a_system_message();
        Ok(template)
    }

    /// llama.cpp's probe (minja's `supports_system_role`): a system message and a user
    /// message rendered, and the system message's text found in the result.
    fn shows_a_system_message(&self) -> bool {
        const NEEDLE: &str = "<System Needle>";
        let probe = [
            TemplateMessage {
                role: "system",
                content: NEEDLE.into(),
            },
            TemplateMessage {
                role: "user",
                content: "<User Needle>".into(),
            },
        ];
        self.render_messages(&probe, false, 0)
            .is_ok_and(|text| text.contains(NEEDLE))
    }

    /// Whether the template shows system messages itself; where it does not, they are
    /// merged into the next user turn, as llama.cpp's server does.
    pub fn has_system_role(&self) -> bool {
        self.system_role
    }

    /// Renders the conversation and opens the assistant's turn, at the current time
    /// (for templates that print today's date).
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.render_at(messages, true, now)
    }

    /// Renders the conversation as it stands at `unix_seconds` (UTC), opening the
    /// assistant's turn if `add_generation_prompt`. The context is what
    /// llama-cpp-python passes: `tools`, `tool_choice`, `functions` and `function_call`
    /// are none (tools reach the model through the gateway's own presentation).
    pub fn render_at(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        unix_seconds: i64,
    ) -> Result<String, TokenizerError> {
        let messages: Vec<TemplateMessage<'_>> = if self.system_role {
            messages
                .iter()
                .map(|m| TemplateMessage {
                    role: role_name(m.role),
                    content: m.content.as_str().into(),
                })
                .collect()
        } else {
            merge_system_turns(messages)
        };
        self.render_messages(&messages, add_generation_prompt, unix_seconds)
    }

    fn render_messages(
        &self,
        messages: &[TemplateMessage<'_>],
        add_generation_prompt: bool,
        unix_seconds: i64,
    ) -> Result<String, TokenizerError> {
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| TokenizerError::BadModel(e.to_string()))?;
        let strftime_now = Value::from_function(move |format: String| {
            crate::strftime::strftime(unix_seconds, &format)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
        });
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
                strftime_now => strftime_now,
                tools => Value::from(()),
                tool_choice => Value::from(()),
                functions => Value::from(()),
                function_call => Value::from(()),
            })
            .map_err(|e| {
                TokenizerError::BadRequest(format!("chat template refused the messages: {e}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_turns() {
        let t = ChatTemplate::new(None, Fallback::ChatMl, String::new(), String::new()).unwrap();
        let text = t
            .render(&[ChatMessage {
                role: Role::User,
                content: "Hi".into(),
            }])
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// A template from a peer's file that would loop for ever (10^10 iterations) runs
    /// out of fuel: a clear error in well under a second, not a hung thread.
    #[test]
    fn a_template_that_never_ends_runs_out_of_fuel() {
        let endless =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(
            Some(endless.into()),
            Fallback::ChatMl,
            String::new(),
            String::new(),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let err = t.render(&[]).unwrap_err().to_string();
        assert!(err.contains("chat template refused the messages"), "{err}");
        assert!(err.contains("fuel"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // A long ordinary conversation renders well within it.
        let chatml =
            ChatTemplate::new(None, Fallback::ChatMl, String::new(), String::new()).unwrap();
        let long: Vec<ChatMessage> = (0..2000)
            .map(|i| ChatMessage {
                role: if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                },
                content: format!("message {i}"),
            })
            .collect();
        assert!(chatml.render(&long).is_ok());
    }

    #[test]
    fn raise_exception_becomes_a_bad_request() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}".into()),
            Fallback::ChatMl,
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&[]).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }

    /// llama.cpp's polyfill for a template without a system role: system messages open
    /// the next user turn (line breaks between), or stand as a user turn of their own
    /// before an assistant turn and at the end.
    #[test]
    fn system_messages_merge_into_the_next_user_turn_without_a_system_role() {
        let no_system = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}";
        let t = ChatTemplate::new(
            Some(no_system.into()),
            Fallback::ChatMl,
            String::new(),
            String::new(),
        )
        .unwrap();
        assert!(!t.has_system_role());
        let message = |role, content: &str| ChatMessage {
            role,
            content: content.into(),
        };
        let text = t
            .render_at(
                &[
                    message(Role::System, "Be brief."),
                    message(Role::System, "Use French."),
                    message(Role::User, "Hi"),
                    message(Role::System, "Now English."),
                    message(Role::Assistant, "Bonjour."),
                    message(Role::System, "Last."),
                ],
                false,
                0,
            )
            .unwrap();
        assert_eq!(
            text,
            "[user:Be brief.\nUse French.\nHi][user:Now English.][assistant:Bonjour.][user:Last.]"
        );
        let chatml = ChatTemplate::new(None, Fallback::ChatMl, String::new(), String::new());
        assert!(chatml.unwrap().has_system_role());
    }

    #[test]
    fn gemma_fallback_folds_the_system_message_into_the_first_turn() {
        let t = ChatTemplate::new(None, Fallback::Gemma, "<bos>".into(), "<eos>".into()).unwrap();
        let message = |role, content: &str| ChatMessage {
            role,
            content: content.into(),
        };
        let text = t
            .render(&[
                message(Role::System, "Be brief."),
                message(Role::User, "Hi"),
                message(Role::Assistant, "Hello."),
                message(Role::User, "Bye"),
            ])
            .unwrap();
        assert_eq!(
            text,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let plain = t.render(&[message(Role::User, "Hi")]).unwrap();
        assert_eq!(
            plain,
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }
}
