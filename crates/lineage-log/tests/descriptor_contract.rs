//! The descriptor contract: a `subagent/descriptor` has the version this build supports; a
//! continuable one has a label; a one-shot one carries none of the continuable-only fields; a tool
//! filter declares allow, deny or both. Appending a descriptor that breaks it is refused naming its
//! seq and the field, and nothing enters the log; descriptors the delegation layer writes pass.

use lineage_log::{
    DescriptorMode, Event, EventBody, EventKind, Log, LogError, SubagentDescriptor, Text,
    ToolFilter, check_descriptor,
};
use lineage_testkit::ev::{self, mid};

fn continuable() -> SubagentDescriptor {
    SubagentDescriptor {
        label: Some(Text::from("reviewer")),
        endpoint: Some(Text::from("p")),
        model: Some(Text::from("m")),
        persona: Some(Text::from("You review.")),
        tool_filter: Some(ToolFilter {
            allow: Some(vec![Text::from("grep")]),
            deny: None,
        }),
        ..SubagentDescriptor::new(DescriptorMode::Continuable, "spawn")
    }
}

fn one_shot() -> SubagentDescriptor {
    SubagentDescriptor {
        label: Some(Text::from("once")),
        ..SubagentDescriptor::new(DescriptorMode::OneShot, "spawn")
    }
}

/// The forbidden descriptors, each with the field its refusal must name.
fn forbidden() -> Vec<(SubagentDescriptor, &'static str)> {
    vec![
        (
            SubagentDescriptor {
                version: SubagentDescriptor::VERSION + 1,
                ..continuable()
            },
            "version",
        ),
        (
            SubagentDescriptor {
                version: 1,
                ..one_shot()
            },
            "version",
        ),
        (
            SubagentDescriptor {
                label: None,
                ..continuable()
            },
            "label",
        ),
        (
            SubagentDescriptor {
                persona: Some(Text::from("x")),
                ..one_shot()
            },
            "persona",
        ),
        (
            SubagentDescriptor {
                model: Some(Text::from("m")),
                ..one_shot()
            },
            "model",
        ),
        (
            SubagentDescriptor {
                endpoint: Some(Text::from("p")),
                ..one_shot()
            },
            "endpoint",
        ),
        (
            SubagentDescriptor {
                tool_filter: Some(ToolFilter {
                    allow: Some(vec![]),
                    deny: None,
                }),
                ..one_shot()
            },
            "tool_filter",
        ),
        (
            SubagentDescriptor {
                tool_filter: Some(ToolFilter::default()),
                ..continuable()
            },
            "tool_filter",
        ),
    ]
}

/// Descriptors as the delegation layer writes them: each keeps the contract and is appended.
fn descriptors_the_delegation_layer_writes_keep_the_contract() {
    let bare = SubagentDescriptor {
        label: Some(Text::from("x")),
        ..SubagentDescriptor::new(DescriptorMode::Continuable, "fork")
    };
    let deny_only = SubagentDescriptor {
        tool_filter: Some(ToolFilter {
            allow: None,
            deny: Some(vec![Text::from("shell")]),
        }),
        ..continuable()
    };
    for descriptor in [
        continuable(),
        bare,
        deny_only,
        one_shot(),
        SubagentDescriptor::new(DescriptorMode::OneShot, "spawn"),
    ] {
        assert_eq!(check_descriptor(&descriptor), Ok(()), "{descriptor:?}");
        let mut log = Log::new();
        log.append(vec![Event::new(0, 0, EventBody::from(descriptor))])
            .expect("a descriptor that keeps the contract is appended");
        assert_eq!(log.events().len(), 1);
    }
}

#[test]
fn appending_a_descriptor_that_breaks_the_contract_is_refused_naming_seq_and_field() {
    descriptors_the_delegation_layer_writes_keep_the_contract();
    for (descriptor, field) in forbidden() {
        let problem = check_descriptor(&descriptor).expect_err(field);
        assert!(problem.contains(field), "{problem} should name {field}");

        let mut log = Log::new();
        log.append(vec![Event::new(
            0,
            0,
            EventBody::from(ev::user_text_message(mid(1), "hi")),
        )])
        .unwrap();
        let batch = vec![
            Event::new(1, 0, EventBody::from(descriptor.clone())),
            Event::new(2, 0, EventBody::from(ev::user_text_message(mid(2), "more"))),
        ];
        match log.append(batch) {
            Err(LogError::InvalidEvent {
                seq: 1,
                kind: EventKind::SubagentDescriptor,
                reason,
            }) => assert!(reason.contains(field), "{reason} should name {field}"),
            other => panic!("expected seq 1 refused for {field}, got {other:?}"),
        }
        assert_eq!(
            log.events().len(),
            1,
            "nothing of the batch entered the log"
        );
    }
}
