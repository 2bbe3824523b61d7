#!/usr/bin/python
# -*- coding: utf-8 -*-
# gateway_resource: any resource gwctl apply takes, present or absent, through gwctl (module_utils/gwctl.py says
# why the CLI and not the Auth API).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: gateway_resource
short_description: Manage a gateway resource (role, user, token, connector, lock, maintenance window) with gwctl
description:
  - C(state=present) runs C(gwctl apply) on the resource (or on every document of C(src)); the Auth Service
    computes the plan against what is stored and writes it in one conditioned write. Unchanged resources report
    C(changed=false).
  - C(state=absent) removes the resource with C(gwctl rm) when it exists.
  - Check mode runs C(gwctl apply --dry-run); diff mode returns the plan's unified diff (secrets shown as ***).
  - Resources applied here carry the labels C(gateway.dev/managed-by=gwctl-apply) and
    C(gateway.dev/apply-set=<apply_set>); this module never prunes.
options:
  resource:
    description: One resource as gwctl reads it (kind, version, metadata, spec).
    type: dict
  src:
    description: A manifest file on the managed host (YAML or JSON, several documents allowed).
    type: path
  state:
    description: Whether the resource should exist.
    type: str
    choices: [present, absent]
    default: present
  apply_set:
    description: The apply set the resource is labelled with (what C(gwctl apply --prune --set) considers).
    type: str
    default: ansible
  gwctl:
    description: The gwctl program.
    type: str
    default: gwctl
  data_dir:
    description: The Auth Service's data directory, for its local admin identity (gwctl --data-dir).
    type: path
  auth_server:
    description: The Auth Service's API address (gwctl --auth-server).
    type: str
  config:
    description: The gateway configuration file (gwctl --config).
    type: path
author: Gateway maintainers
'''

EXAMPLES = r'''
- name: A role for the people who manage the maintenance window
  gateway.gateway.gateway_resource:
    resource:
      kind: role
      version: v7
      metadata: {name: maintenance-admin}
      spec:
        allow:
          rules: [{resources: [cluster_maintenance_config], verbs: [create, read, update, delete]}]

- name: Every resource of a manifest file
  gateway.gateway.gateway_resource:
    src: /etc/gateway/resources/roles.yaml

- name: Gone
  gateway.gateway.gateway_resource:
    resource: {kind: role, metadata: {name: contractor}}
    state: absent
'''

RETURN = r'''
plan:
  description: The plan of gwctl apply, one entry per resource (kind, name, action, diff).
  returned: state=present
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gateway.gateway.plugins.module_utils.gwctl import CONNECTION_OPTIONS, exit_applied, remove


def documents_of_src(module, path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode('utf-8')
    except (IOError, OSError, UnicodeDecodeError) as e:
        module.fail_json(msg='cannot read %s: %s' % (path, e))


def absent(module):
    p = module.params
    targets = []
    if p['resource']:
        targets.append(p['resource'])
    else:
        import yaml  # ansible-core depends on PyYAML

        targets.extend(d for d in yaml.safe_load_all(documents_of_src(module, p['src'])) if d)
    changed = False
    before = []
    for doc in targets:
        kind = doc.get('kind')
        name = (doc.get('metadata') or {}).get('name', '')
        if not kind or (not name and kind != 'cluster_maintenance_config'):
            module.fail_json(msg='state=absent needs kind and metadata.name')
        removed, text = remove(module, kind, name)
        changed = changed or removed
        if removed:
            before.append(text)
    result = dict(changed=changed)
    if module._diff:
        result['diff'] = dict(before=''.join(before), after='')
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            resource=dict(type='dict'),
            src=dict(type='path'),
            state=dict(type='str', choices=['present', 'absent'], default='present'),
            apply_set=dict(type='str', default='ansible'),
            **CONNECTION_OPTIONS
        ),
        mutually_exclusive=[('resource', 'src')],
        required_one_of=[('resource', 'src')],
        supports_check_mode=True,
    )
    if module.params['state'] == 'absent':
        absent(module)
    p = module.params
    docs = [p['resource']] if p['resource'] else documents_of_src(module, p['src'])
    exit_applied(module, docs, p['apply_set'])


if __name__ == '__main__':
    main()
