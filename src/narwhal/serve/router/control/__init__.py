"""Who may serve: the controller lease (file or sidecar quorum), leadership and standby,
and the attestation binding.
"""
