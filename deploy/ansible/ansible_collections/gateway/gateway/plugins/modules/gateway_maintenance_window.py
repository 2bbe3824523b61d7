#!/usr/bin/python
# -*- coding: utf-8 -*-
# gateway_maintenance_window: the cluster's cluster_maintenance_config from two parameters, through gwctl apply
# (the same path as gateway_resource; the Auth Service validates the values as it does for any manifest).
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r'''
module: gateway_maintenance_window
short_description: Set the weekly window in which the gateway's agents may upgrade
description:
  - Applies the cluster's C(cluster_maintenance_config) with C(gwctl apply) (check and diff modes supported), or
    removes it with C(state=absent).
options:
  utc_start_hour:
    description: The hour (UTC, 0-23) at which the one-hour window opens. Required with state=present.
    type: int
  weekdays:
    description: The days (Sun..Sat, or ["*"] for every day); left out, every day.
    type: list
    elements: str
  state:
    type: str
    choices: [present, absent]
    default: present
    description: Whether the window should be set.
  apply_set:
    type: str
    default: ansible
    description: The apply set the resource is labelled with.
  gwctl:
    type: str
    default: gwctl
    description: The gwctl program.
  data_dir:
    type: path
    description: The Auth Service's data directory (gwctl --data-dir).
  auth_server:
    type: str
    description: The Auth Service's API address (gwctl --auth-server).
  config:
    type: path
    description: The gateway configuration file (gwctl --config).
author: Gateway maintainers
'''

EXAMPLES = r'''
- gateway.gateway.gateway_maintenance_window:
    utc_start_hour: 2
    weekdays: [Mon, Wed, Fri]
'''

RETURN = r'''
plan:
  description: The plan of gwctl apply.
  returned: state=present
  type: list
  elements: dict
'''

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gateway.gateway.plugins.module_utils.gwctl import CONNECTION_OPTIONS, exit_applied, remove


def main():
    module = AnsibleModule(
        argument_spec=dict(
            utc_start_hour=dict(type='int'),
            weekdays=dict(type='list', elements='str'),
            state=dict(type='str', choices=['present', 'absent'], default='present'),
            apply_set=dict(type='str', default='ansible'),
            **CONNECTION_OPTIONS
        ),
        required_if=[('state', 'present', ['utc_start_hour'])],
        supports_check_mode=True,
    )
    p = module.params
    if p['state'] == 'absent':
        changed, before = remove(module, 'cluster_maintenance_config', '')
        module.exit_json(changed=changed, **(dict(diff=dict(before=before, after='')) if module._diff else {}))
    upgrades = dict(utc_start_hour=p['utc_start_hour'])
    if p['weekdays'] is not None:
        upgrades['weekdays'] = p['weekdays']
    doc = dict(kind='cluster_maintenance_config', version='v1', metadata=dict(name='cluster-maintenance-config'), spec=dict(agent_upgrades=upgrades))
    exit_applied(module, [doc], p['apply_set'])


if __name__ == '__main__':
    main()
