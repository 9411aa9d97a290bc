"""The playbook's attention: scaled dot-product attention (FA2 mma, wgmma, SIMT)."""
