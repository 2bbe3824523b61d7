# -*- coding: utf-8 -*-
# The one way the gateway.gateway modules reach the gateway: the gwctl CLI, its stable surface.
#
# Why gwctl and not the Auth API from Python: gwctl finds the credentials the way an operator's shell does (the
# local admin identity of --data-dir, --auth-server, a gwsh profile), speaks mutual TLS with the cluster CA pinned,
# and `gwctl apply` computes the plan on the Auth Service, with secrets compared there and shown as ***; a
# second client in Python would have to do all of that again and would drift from it. The modules run
# `gwctl apply -f - --format json` (the manifest on standard input, so no file holds it), with --dry-run in check
# mode, and report the plan: changed when an entry is not "unchanged", the plan's unified diffs in diff mode.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import json
import re

CONNECTION_OPTIONS = dict(
    gwctl=dict(type='str', default='gwctl'),
    data_dir=dict(type='path'),
    auth_server=dict(type='str'),
    config=dict(type='path'),
)

_CODE = re.compile(r'^code: (GW_ERR_[A-Z0-9_]+)$', re.M)


def base_command(module):
    p = module.params
    cmd = [p['gwctl']]
    if p.get('data_dir'):
        cmd += ['--data-dir', p['data_dir']]
    if p.get('auth_server'):
        cmd += ['--auth-server', p['auth_server']]
    if p.get('config'):
        cmd += ['--config', p['config']]
    return cmd


def error_code(stderr):
    m = _CODE.search(stderr or '')
    return m.group(1) if m else None


def fail(module, what, rc, stdout, stderr):
    """Fails the task with gwctl's own error, hint and code (it never prints a secret)."""
    module.fail_json(msg='%s: %s' % (what, (stderr or stdout or 'no output').strip()), rc=rc, code=error_code(stderr))


def apply(module, documents, apply_set):
    """Runs gwctl apply on a list of resources (dicts) or a manifest text; returns (changed, plan result)."""
    manifest = documents if isinstance(documents, str) else '\n---\n'.join(json.dumps(d) for d in documents)
    cmd = base_command(module) + ['apply', '-f', '-', '--format', 'json', '--set', apply_set]
    if module.check_mode:
        cmd.append('--dry-run')
    rc, out, err = module.run_command(cmd, data=manifest, binary_data=True)
    if rc != 0:
        fail(module, 'gwctl apply', rc, out, err)
    try:
        result = json.loads(out)
    except ValueError:
        module.fail_json(msg='gwctl apply printed no JSON plan: %s' % out[:200])
    changed = any(e['action'] != 'unchanged' for e in result['plan'])
    return changed, result


def plan_diff(result):
    """The plan's unified diffs, one after the other: Ansible's "prepared" diff."""
    return ''.join(e.get('diff', '') for e in result['plan'] if e['action'] != 'unchanged')


def exit_applied(module, documents, apply_set):
    """Applies the documents and exits the module with changed, the plan and, in diff mode, the plan's diffs."""
    changed, result = apply(module, documents, apply_set)
    out = dict(changed=changed, plan=result['plan'])
    if module._diff and changed:
        out['diff'] = dict(prepared=plan_diff(result))
    module.exit_json(**out)


def shown_name(kind, name):
    """How gwctl names a resource: a token by its id (the first 12 hex digits of its SHA-256), never itself."""
    if kind == 'token':
        return hashlib.sha256(name.encode('utf-8')).hexdigest()[:12]
    return name


def remove(module, kind, name):
    """Removes one resource if it exists; returns (changed, its YAML before)."""
    if kind == 'cluster_maintenance_config' and not name:
        name = 'cluster-maintenance-config'
    rc, out, err = module.run_command(base_command(module) + ['get', '%s/%s' % (kind, shown_name(kind, name))])
    if rc != 0:
        if error_code(err) == 'GW_ERR_RESOURCE_NOT_FOUND':
            return False, ''
        fail(module, 'gwctl get', rc, out, err)
    if not module.check_mode:
        rc, rm_out, err = module.run_command(base_command(module) + ['rm', '%s/%s' % (kind, name)])
        if rc != 0 and error_code(err) != 'GW_ERR_RESOURCE_NOT_FOUND':
            fail(module, 'gwctl rm', rc, rm_out, err)
    return True, out
