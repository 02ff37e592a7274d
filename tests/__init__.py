"""Tests: they mirror the packages (messages/, actors/, node/, cli/, launch/, workflow/);
support/ holds the harness (nodes, runs, docs). Tiers are markers: slow, processes."""
