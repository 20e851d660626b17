"""The lab: the Lance tables, their schema, column sync, queries and maintenance."""
