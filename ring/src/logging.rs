//! `ringd`'s log lines, text or JSON (`[log] format`, `--log-format`), through `tracing`.
//!
//! Every line names the member that wrote it (`member`), whichever task or library logged it:
//! the formatter adds it, so no span has to reach every spawned task. Per-control-plane work
//! (an etcd driver instance, the agent's reconcile of one control plane, the leader's decisions
//! about one) runs inside a [`control_plane_span`], whose `control_plane` and `epoch` fields
//! every line logged inside it carries.
//!
//! Text:
//!
//! ```text
//! 2026-12-01T02:53:35.163412Z  INFO member=a cp{control_plane=cp-a epoch=2}: etcd serves on 10.0.0.1:443
//! ```
//!
//! JSON: one object per line, everything at the top level. First `timestamp`, `level`,
//! `target`, `member`; then, in alphabetical order, the fields of the spans the line was
//! logged in and the event's own fields, `message` among them (an inner span's field replaces
//! an outer one's of the same name, and the event's own field any span's):
//!
//! ```text
//! {"timestamp":"2026-12-01T02:53:35.163412Z","level":"INFO","target":"garden_ring::agent::etcd","member":"a","control_plane":"cp-a","epoch":2,"message":"etcd serves on 10.0.0.1:443"}
//! ```
//!
//! so `jq 'select(.control_plane == "cp-a")'` finds a control plane's story.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::{LogFormat, LogSettings};

/// The span of per-control-plane work: its lines carry `control_plane` and `epoch`.
///
/// It is an error-level span so that it is enabled under every filter that lets any line
/// through (a span a filter disables lends its fields to nobody), and a root span: work for a
/// control plane started from the work for it (the agent starting an etcd instance, which
/// starts a guard) would otherwise repeat the same fields once per level.
pub fn control_plane_span(name: &str, epoch: u64) -> tracing::Span {
    tracing::error_span!(target: "garden_ring", parent: None, "cp", control_plane = %name, epoch)
}

/// The library whose `info` lines are per DNS query; kept at `warn` unless the level names it.
const QUIET_TARGET: &str = "hickory_server";

/// Installs the global subscriber for member `member`, writing to stderr.
pub fn init(settings: &LogSettings, member: &str) {
    let mut filter = tracing_subscriber::EnvFilter::new(&settings.level);
    // hickory-server logs every query it answers at `info` (two lines each): with thousands
    // of records the leader's DNS checks alone wrote tens of thousands of lines a minute.
    // Its warnings and errors stay; a level that names it explicitly decides itself.
    if !settings.level.contains(QUIET_TARGET)
        && let Ok(directive) = format!("{QUIET_TARGET}=warn").parse()
    {
        filter = filter.add_directive(directive);
    }
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match settings.format {
        LogFormat::Text => builder.event_format(TextLine::new(member)).init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(JsonLine::new(member))
            .init(),
    }
}

/// Text lines: time, level, `member=<name>`, the spans with their fields, the event.
#[derive(Debug, Clone)]
pub struct TextLine {
    member: String,
}

impl TextLine {
    /// Lines of member `member`.
    pub fn new(member: &str) -> Self {
        Self {
            member: member.to_string(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for TextLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut writer)?;
        write!(
            writer,
            " {:>5} member={}",
            event.metadata().level(),
            self.member
        )?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(writer, " {}", span.name())?;
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && !fields.fields.is_empty()
                {
                    write!(writer, "{{{}}}", fields.fields)?;
                }
                writer.write_char(':')?;
            }
        }
        writer.write_char(' ')?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// JSON lines: see the module documentation. Needs [`JsonFields`] as the span field formatter.
#[derive(Debug, Clone)]
pub struct JsonLine {
    member: String,
}

impl JsonLine {
    /// Lines of member `member`.
    pub fn new(member: &str) -> Self {
        Self {
            member: member.to_string(),
        }
    }
}

impl<S> FormatEvent<S, JsonFields> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let metadata = event.metadata();
        let mut fields = Map::new();
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let Some(stored) = extensions.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(span_fields)) = serde_json::from_str(&stored.fields) {
                    fields.extend(span_fields);
                }
            }
        }
        event.record(&mut JsonVisitor(&mut fields));
        let head = [
            ("timestamp", Value::from(timestamp)),
            ("level", Value::from(metadata.level().as_str())),
            ("target", Value::from(metadata.target())),
            ("member", Value::from(self.member.as_str())),
        ];
        writer.write_char('{')?;
        let mut first = true;
        let reserved = |k: &str| head.iter().any(|(h, _)| *h == k);
        let rest = fields.iter().filter(|(k, _)| !reserved(k));
        for (key, value) in head
            .iter()
            .map(|(k, v)| (*k, v))
            .chain(rest.map(|(k, v)| (k.as_str(), v)))
        {
            if !first {
                writer.write_char(',')?;
            }
            first = false;
            write!(writer, "{}:{}", Value::from(key), value)?;
        }
        writer.write_str("}\n")
    }
}

/// Collects an event's fields as JSON values (`log.*` fields of bridged `log` records left out).
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl JsonVisitor<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        if !field.name().starts_with("log.") {
            self.0.insert(field.name().to_string(), value);
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl Buffer {
        fn lines(&self) -> Vec<String> {
            String::from_utf8(self.0.lock().unwrap().clone())
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect()
        }
    }

    fn log_some() {
        tracing::info!("starting");
        let outer = tracing::info_span!("work", step = "copy", epoch = 1u64);
        let _outer = outer.enter();
        tracing::info!("in an ordinary span");
        let span = control_plane_span("cp-a", 7);
        let _entered = span.enter();
        tracing::warn!(bytes = 42u64, ok = true, "copied \"it\"");
    }

    #[test]
    fn json_lines_carry_member_span_and_event_fields_at_the_top() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .fmt_fields(JsonFields::new())
            .event_format(JsonLine::new("a"))
            .finish();
        tracing::subscriber::with_default(subscriber, log_some);
        let lines: Vec<Value> = buffer
            .lines()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0]["member"], "a");
        assert_eq!(lines[0]["message"], "starting");
        assert_eq!(lines[0]["level"], "INFO");
        assert!(lines[0].get("control_plane").is_none());
        // An ordinary span's fields are flattened too.
        assert_eq!(lines[1]["step"], "copy");
        assert_eq!(lines[1]["epoch"], 1);
        assert_eq!(lines[1]["member"], "a");
        let l = &lines[2];
        assert_eq!(l["member"], "a");
        assert_eq!(l["control_plane"], "cp-a");
        assert_eq!(l["epoch"], 7);
        assert!(
            l.get("step").is_none(),
            "a control plane span is a root span"
        );
        assert_eq!(l["bytes"], 42);
        assert_eq!(l["ok"], true);
        assert_eq!(l["message"], "copied \"it\"");
        assert_eq!(l["level"], "WARN");
        assert!(buffer.lines()[2].starts_with("{\"timestamp\":"));
    }

    #[test]
    fn a_control_plane_span_inside_another_shows_once() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .event_format(TextLine::new("a"))
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let _outer = control_plane_span("cp-a", 1).entered();
            let _inner = control_plane_span("cp-a", 1).entered();
            tracing::info!("guard: started");
        });
        let lines = buffer.lines();
        assert!(
            lines[0].ends_with(" INFO member=a cp{control_plane=cp-a epoch=1}: guard: started"),
            "{lines:?}"
        );
    }

    #[test]
    fn text_lines_carry_member_and_spans() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .event_format(TextLine::new("a"))
            .finish();
        tracing::subscriber::with_default(subscriber, log_some);
        let lines = buffer.lines();
        assert!(lines[0].ends_with(" INFO member=a starting"), "{lines:?}");
        assert!(
            lines[1].ends_with(" INFO member=a work{step=\"copy\" epoch=1}: in an ordinary span"),
            "{lines:?}"
        );
        assert!(
            lines[2].ends_with(
                " WARN member=a cp{control_plane=cp-a epoch=7}: copied \"it\" bytes=42 ok=true"
            ),
            "{lines:?}"
        );
    }
}
