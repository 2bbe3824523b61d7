/**
 * autoupdate_config and autoupdate_version as manifests (src/auth/resources/schema.ts): defaults, and every bad
 * field refused with its GW_ERR_AUTOUPDATE_* code; autoupdate_agent_rollout refused as a manifest (read-only).
 */
import { describe, expect, it } from 'vitest';
import { parseManifest, toYaml, type AutoupdateConfig, type AutoupdateVersion } from '../../../src/auth/resources/index.js';
import { isGatewayError, type ErrorCode } from '../../../src/errors.js';

function problems(text: string): Array<{ code: ErrorCode; path: string }> {
  try {
    parseManifest(text, 'in.yaml');
  } catch (err) {
    if (isGatewayError(err, 'GW_ERR_RESOURCE_INVALID')) return err.details.problems as Array<{ code: ErrorCode; path: string }>;
    throw err;
  }
  throw new Error(`accepted:\n${text}`);
}

const CONFIG = `kind: autoupdate_config
spec:
  agents:
    schedules:
      regular:
        - name: dev
          days: [Mon, tuesday]
          start_hour: 9
          time_zone: Europe/Paris
          canary_count: 2
        - name: prod
          wait_hours: 24
`;

describe('autoupdate_config', () => {
  it('takes its defaults and round-trips', () => {
    const [r] = parseManifest(CONFIG, 'in.yaml') as [AutoupdateConfig];
    expect(r.metadata.name).toBe('autoupdate-config');
    expect(r.spec.agents).toMatchObject({ mode: 'enabled', strategy: 'halt-on-error', maintenance_window_duration: '1h', canary_healthy_for: '5m', canary_deadline: '30m', stale_after: '24h' });
    expect(r.spec.agents.schedules.regular[0]).toEqual({ name: 'dev', days: ['Mon', 'Tue'], start_hour: 9, time_zone: 'Europe/Paris', wait_hours: 0, canary_count: 2 });
    expect(r.spec.agents.schedules.regular[1]).toMatchObject({ days: ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'], time_zone: 'UTC', wait_hours: 24 });
    expect(parseManifest(toYaml([r]), 'out.yaml')).toEqual([r]);
  });

  it.each([
    ['a bad time zone', CONFIG.replace('Europe/Paris', 'CEST+2'), 'GW_ERR_AUTOUPDATE_TIME_ZONE'],
    ['a bad group name', CONFIG.replace('name: dev', 'name: Dev_1'), 'GW_ERR_AUTOUPDATE_SCHEDULE'],
    ['six canaries', CONFIG.replace('canary_count: 2', 'canary_count: 6'), 'GW_ERR_AUTOUPDATE_SCHEDULE'],
    ['a start hour of 24', CONFIG.replace('start_hour: 9', 'start_hour: 24'), 'GW_ERR_AUTOUPDATE_SCHEDULE'],
    ['canary_healthy_for under 10s', CONFIG.replace('  agents:\n', '  agents:\n    canary_healthy_for: 5s\n'), 'GW_ERR_AUTOUPDATE_SCHEDULE'],
    ['a catch_all naming no group', CONFIG.replace('  agents:\n', '  agents:\n    catch_all: staging\n'), 'GW_ERR_AUTOUPDATE_SCHEDULE'],
    ['a bad strategy', CONFIG.replace('  agents:\n', '  agents:\n    strategy: yolo\n'), 'GW_ERR_CONFIG_VALUE'],
    ['another name', CONFIG.replace('kind: autoupdate_config\n', 'kind: autoupdate_config\nmetadata: {name: other}\n'), 'GW_ERR_CONFIG_VALUE'],
  ])('refuses %s', (_what, text, code) => {
    expect(problems(text).map((p) => p.code)).toContain(code);
  });

  it('refuses 17 groups and a duplicate group', () => {
    const many = `kind: autoupdate_config\nspec:\n  agents:\n    schedules:\n      regular:\n${Array.from({ length: 17 }, (_, i) => `        - name: g${i}\n`).join('')}`;
    expect(problems(many).length).toBeGreaterThan(0);
    expect(problems(CONFIG.replace('name: prod', 'name: dev')).length).toBeGreaterThan(0);
  });

  it('takes catch_all disabled', () => {
    const [r] = parseManifest(CONFIG.replace('  agents:\n', '  agents:\n    catch_all: disabled\n'), 'in.yaml') as [AutoupdateConfig];
    expect(r.spec.agents.catch_all).toBe('disabled');
  });
});

describe('autoupdate_version', () => {
  const VERSION = 'kind: autoupdate_version\nspec:\n  agents:\n    start_version: v17.0.0\n    target_version: 17.1.0\n';

  it('stores versions without a leading v, with its defaults', () => {
    const [r] = parseManifest(VERSION, 'in.yaml') as [AutoupdateVersion];
    expect(r.metadata.name).toBe('autoupdate-version');
    expect(r.spec.agents).toEqual({ start_version: '17.0.0', target_version: '17.1.0', schedule: 'regular', mode: 'enabled', critical: false });
  });

  it.each([
    ['a target that is not a version', VERSION.replace('17.1.0', 'latest'), 'GW_ERR_AUTOUPDATE_VERSION'],
    ['critical not a boolean', `${VERSION}    critical: maybe\n`, 'GW_ERR_AUTOUPDATE_VERSION'],
    ['a bad schedule', `${VERSION}    schedule: never\n`, 'GW_ERR_CONFIG_VALUE'],
  ])('refuses %s', (_what, text, code) => {
    expect(problems(text).map((p) => p.code)).toContain(code);
  });
});

describe('autoupdate_agent_rollout', () => {
  it('is read-only: a manifest of it is refused with its own code', () => {
    expect(problems('kind: autoupdate_agent_rollout\nversion: v1\nmetadata: {name: x}\nspec: {}\n').map((p) => p.code)).toEqual(['GW_ERR_AUTOUPDATE_READ_ONLY']);
  });
});
