"""Presentation: the claims ledger and its measurements, the chapter registry, tables, HTML boxes and chapter
numbers (report), toy examples (teaching), figures (plots) and the book build; DESIGN.md section 12."""
