"""Curation: recipes, subset selection and persisted subsets."""
