/**
 * The rollout contract's pure checks (src/wire/autoupdate.ts): an upgrader's strict parse of an instruction, and
 * the Proxy's bounds on an agent's health. Hostile inputs: oversized, wrong types, a lying version, a future time.
 */
import { describe, expect, it } from 'vitest';
import { AGENT_HEALTH_MAX_CHECKS, AGENT_INSTRUCTION_MAX_BYTES, checkAgentHealth, parseAgentInstruction } from '../../src/wire/autoupdate.js';

const ok = (o: unknown) => parseAgentInstruction(JSON.stringify(o));

describe('parseAgentInstruction', () => {
  it('takes a managed answer and keeps only the known fields', () => {
    const r = ok({ managed: true, version: '17.0.2', update: true, reason: 'canary of group dev', group: 'dev', canary: true, critical: false, rollout_id: 'r-42', issued_at: '2026-11-29T10:00:00Z', extra: { x: 1 } });
    expect(r).toEqual({ ok: true, instruction: { managed: true, version: '17.0.2', update: true, reason: 'canary of group dev', group: 'dev', canary: true, critical: false, rollout_id: 'r-42', issued_at: '2026-11-29T10:00:00Z' } });
    expect(ok({ managed: false, update: false, reason: 'no autoupdate_config' })).toEqual({ ok: true, instruction: { managed: false, update: false, reason: 'no autoupdate_config' } });
    expect(ok({ managed: true, update: false, reason: 'in no group', group: '' })).toMatchObject({ ok: true });
  });

  it.each([
    ['not JSON', '{managed: true'],
    ['an array', '[]'],
    ['null', 'null'],
    ['managed as text', JSON.stringify({ managed: 'true', update: true, reason: 'r', version: '1.2.3' })],
    ['update missing', JSON.stringify({ managed: true, reason: 'r', version: '1.2.3' })],
    ['reason missing', JSON.stringify({ managed: true, update: false })],
    ['a reason with a terminal escape', JSON.stringify({ managed: true, update: false, reason: 'ok\u001b[2J' })],
    ['a reason of 10 000 characters', JSON.stringify({ managed: true, update: false, reason: 'r'.repeat(10_000) })],
    ['a version with a leading v', JSON.stringify({ managed: true, update: true, reason: 'r', version: 'v17.0.2' })],
    ['a version that is a path', JSON.stringify({ managed: true, update: true, reason: 'r', version: '../../etc/passwd' })],
    ['a version with a shell word', JSON.stringify({ managed: true, update: true, reason: 'r', version: '17.0.2; reboot' })],
    ['update with no version', JSON.stringify({ managed: true, update: true, reason: 'r' })],
    ['a group that is not a name', JSON.stringify({ managed: true, update: false, reason: 'r', group: 'Prod' })],
    ['canary as a number', JSON.stringify({ managed: true, update: false, reason: 'r', canary: 1 })],
    ['a rollout id with a blank', JSON.stringify({ managed: true, update: false, reason: 'r', rollout_id: 'a b' })],
    ['issued_at that is not a time', JSON.stringify({ managed: true, update: false, reason: 'r', issued_at: 'soon' })],
    ['an answer over the cap', JSON.stringify({ managed: false, update: false, reason: 'r', pad: 'x'.repeat(AGENT_INSTRUCTION_MAX_BYTES) })],
  ])('refuses %s, saying why', (_what, body) => {
    const r = parseAgentInstruction(body);
    expect(r.ok).toBe(false);
    if (!r.ok) expect(r.why.length).toBeGreaterThan(5);
  });
});

describe('checkAgentHealth', () => {
  const now = Date.parse('2026-11-29T12:00:00Z');
  const base = { ok: true, checks: [{ name: 'tunnel', ok: true, detail: '1 Proxy tunnel' }], measured_at: '2026-11-29T11:59:58Z' };

  it('takes a bounded health, rebuilt from the known fields', () => {
    expect(checkAgentHealth({ ...base, extra: 'x', upgrader: { result: 'up-to-date', at: '2026-11-29T11:00:00Z', target: '17.0.2', code: 'GW_ERR_UPGRADE_HEALTH', more: 1 } }, now)).toEqual({
      ok: true,
      health: { ...base, measured_at: '2026-11-29T11:59:58.000Z', upgrader: { result: 'up-to-date', at: '2026-11-29T11:00:00Z', target: '17.0.2', code: 'GW_ERR_UPGRADE_HEALTH' } },
    });
    // A clock a little ahead is fine.
    expect(checkAgentHealth({ ...base, measured_at: '2026-11-29T12:04:00Z' }, now).ok).toBe(true);
    expect(checkAgentHealth({ ...base, checks: Array.from({ length: AGENT_HEALTH_MAX_CHECKS }, (_, i) => ({ name: `c${i}`, ok: true })) }, now).ok).toBe(true);
  });

  it.each([
    ['10 000 checks', { ...base, checks: Array.from({ length: 10_000 }, (_, i) => ({ name: `c${i}`, ok: true })) }],
    ['one check over the cap', { ...base, checks: Array.from({ length: AGENT_HEALTH_MAX_CHECKS + 1 }, (_, i) => ({ name: `c${i}`, ok: true })) }],
    ['a 1 MiB detail', { ...base, checks: [{ name: 'tunnel', ok: true, detail: 'x'.repeat(1024 * 1024) }] }],
    ['a detail of 257 characters', { ...base, checks: [{ name: 'tunnel', ok: true, detail: 'x'.repeat(257) }] }],
    ['a name of 65 characters', { ...base, checks: [{ name: 'n'.repeat(65), ok: true }] }],
    ['an empty name', { ...base, checks: [{ name: '', ok: true }] }],
    ['a measured_at a day ahead', { ...base, measured_at: '2026-11-30T12:00:00Z' }],
    ['a measured_at that is not a time', { ...base, measured_at: 'now' }],
    ['ok as text', { ...base, ok: 'true' }],
    ['checks as an object', { ...base, checks: { tunnel: true } }],
    ['a check as a string', { ...base, checks: ['tunnel'] }],
    ['an upgrader code that is not a code', { ...base, upgrader: { result: 'failed', at: '2026-11-29T11:00:00Z', code: '$(reboot)' } }],
    ['an upgrader target that is not a version', { ...base, upgrader: { result: 'failed', at: '2026-11-29T11:00:00Z', target: 'latest' } }],
    ['a number', 42],
  ])('refuses %s', (_what, value) => {
    expect(checkAgentHealth(value, now).ok).toBe(false);
  });
});
