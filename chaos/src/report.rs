//! Reports of chaos runs: JSON, a Markdown table and an SVG timeline.
