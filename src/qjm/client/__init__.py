"""The writer side of qjm: quorum calls, recovery-source choice, the journal manager."""
