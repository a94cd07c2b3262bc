//! Chat templates: the model's own Jinja template from GGUF metadata
//! (`tokenizer.chat_template`), rendered with minijinja as llama.cpp and
//! transformers do. A model without a template falls back to ChatML.

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;
use sharemesh_protocol::{ChatMessage, Role};

use super::EngineError;

const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'static str,
    content: &'a str,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

impl ChatTemplate {
    /// `source` is the GGUF's template, if it has one.
    pub fn new(
        source: Option<String>,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, EngineError> {
        let mut env = Environment::new();
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", source.unwrap_or_else(|| CHATML.to_owned()))
            .map_err(|e| EngineError::BadModel(format!("chat template does not parse: {e}")))?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// Renders the conversation and opens the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        let messages: Vec<TemplateMessage<'_>> = messages
            .iter()
            .map(|m| TemplateMessage {
                role: role_name(m.role),
                content: &m.content,
            })
            .collect();
        let template = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::BadModel(e.to_string()))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| {
                EngineError::BadRequest(format!("chat template refused the messages: {e}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_fallback_renders_turns() {
        let t = ChatTemplate::new(None, String::new(), String::new()).unwrap();
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

    #[test]
    fn raise_exception_becomes_a_bad_request() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}".into()),
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&[]).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }
}
