"""`python -m helpers.review`: every claim of the explainer, checked live on this device (lesson 08).

Imports: core, models, measure, techniques, distributed, frameworks, plan.
"""
