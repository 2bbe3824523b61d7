/**
 * The version server's answers as both ends read them (src/wire/versions.ts): the Proxy normalises what it serves
 * and what an upstream told it with these, the upgraders parse the answers with the same functions.
 */
import { describe, expect, it } from 'vitest';
import { normalizeVersion, parseCritical } from '../../src/wire/versions.js';

describe('normalizeVersion', () => {
  it('gives v<semver> for a version with or without its v, whitespace around ignored, pre-release and build kept', () => {
    expect(normalizeVersion('17.0.1')).toBe('v17.0.1');
    expect(normalizeVersion(' v17.0.1\n')).toBe('v17.0.1');
    expect(normalizeVersion('17.1.0-rc.1+build.5')).toBe('v17.1.0-rc.1+build.5');
  });

  it('refuses what is not semver', () => {
    for (const text of ['', 'v', '17', '17.0', 'vv17.0.1', 'latest', '17.0.1 extra', '-1.0.0']) expect(normalizeVersion(text), text).toBeUndefined();
  });
});

describe('parseCritical', () => {
  it('takes yes and no in any case, whitespace around ignored, and nothing else', () => {
    expect(parseCritical('yes')).toBe('yes');
    expect(parseCritical(' NO\n')).toBe('no');
    for (const text of ['', 'y', 'yes please', '1', 'truthy']) expect(parseCritical(text), text).toBeUndefined();
  });

  it("reads upstream's true / false as yes / no (upstream's maintenance trigger does)", () => {
    expect(parseCritical('true')).toBe('yes');
    expect(parseCritical(' FALSE\n')).toBe('no');
  });
});
