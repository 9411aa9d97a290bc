"""The playbook's loss: the reduction losses (mse, cross entropy, kl_div, ...)."""
