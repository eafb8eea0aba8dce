"""The Kubernetes objects slotune creates for a TunedModel (`resources`) and the cluster admin's runtime policy that
bounds what a TunedModel may ask of them (`admission`). Pure builders and checks: the backends apply them.
"""
