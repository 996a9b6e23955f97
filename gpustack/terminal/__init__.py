"""Everything gpustack prints: tables, JSON documents, live views, JUnit, Error/Hint."""
