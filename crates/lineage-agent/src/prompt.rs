//! System prompt assembly: ordered sections, a persona that an agent may shadow, and
//! runtime-context statements.

use lineage_log::Text;

/// The host's system prompt: a default persona, then named sections in order.
///
/// An agent's own persona (a delegated child's, say) replaces the default persona and keeps the
/// sections. The agent's runtime-context statements close the prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prompt {
    persona: Option<Text>,
    sections: Vec<(Text, Text)>,
}

impl Prompt {
    /// An empty prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same prompt with `persona` as its default persona.
    pub fn persona(mut self, persona: impl Into<Text>) -> Self {
        self.persona = Some(persona.into());
        self
    }

    /// The same prompt with a section `name` holding `text` after the existing ones. A section of
    /// the same name is replaced in place.
    pub fn section(mut self, name: impl Into<Text>, text: impl Into<Text>) -> Self {
        let (name, text) = (name.into(), text.into());
        match self.sections.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = text,
            None => self.sections.push((name, text)),
        }
        self
    }

    /// The system prompt for an agent with `persona` (shadowing the default), the `guidance` of
    /// its visible tools and its `context` statements. Parts are separated by blank lines.
    pub fn render(&self, persona: Option<&str>, guidance: &[&str], context: &[Text]) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if let Some(persona) = persona.or(self.persona.as_deref()) {
            parts.push(persona);
        }
        parts.extend(self.sections.iter().map(|(_, text)| text.as_str()));
        parts.extend(guidance);
        let mut out = parts.join("\n\n");
        if !context.is_empty() {
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str("Runtime context:");
            for statement in context {
                out.push_str("\n- ");
                out.push_str(statement);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_persona_shadows_the_default_and_keeps_the_sections() {
        let prompt = Prompt::new()
            .persona("You are the host.")
            .section("style", "Be brief.")
            .section("safety", "Ask before deleting.");
        assert_eq!(
            prompt.render(None, &[], &[]),
            "You are the host.\n\nBe brief.\n\nAsk before deleting."
        );
        assert_eq!(
            prompt.render(
                Some("You review code."),
                &["Use grep first."],
                &["Your scope is fixed.".into()]
            ),
            "You review code.\n\nBe brief.\n\nAsk before deleting.\n\nUse grep first.\n\nRuntime context:\n- Your scope is fixed."
        );
    }

    #[test]
    fn a_section_of_the_same_name_is_replaced_in_place() {
        let prompt = Prompt::new()
            .section("a", "1")
            .section("b", "2")
            .section("a", "3");
        assert_eq!(prompt.render(None, &[], &[]), "3\n\n2");
    }
}
