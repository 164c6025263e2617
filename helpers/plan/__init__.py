"""`python -m helpers.plan`: any model's training memory planned for a card, from its meta profile.

Imports: core, models, measure, meta, frameworks.
"""
