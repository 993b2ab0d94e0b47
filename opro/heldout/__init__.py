"""Everything that touches held-out questions: compare, its report, the held-out guard, promotion, prompt sources."""
