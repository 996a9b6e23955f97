"""The Ansible side: inventory, role inputs, the one ansible-runner user, results, host locks."""
