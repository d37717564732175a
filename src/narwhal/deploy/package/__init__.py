"""What `narwhal install` ships to hosts: the revision as a git bundle, the locked wheelhouse,
the revision's own wheels, and each role's files, all named by sha256 in one manifest."""
