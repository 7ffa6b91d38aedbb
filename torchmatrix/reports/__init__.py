"""From event logs to reports: cell outcomes, JUnit, results.json, the summary pages and the upgrade diff."""
