"""What a run tells people and machines: text for failures, the JSON report, GitHub
annotations and step summary, and the HTML report."""
