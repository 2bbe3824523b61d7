import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES, GatewayError, httpStatus, isErrorCode, toGatewayError, type ErrorCode } from '../src/errors.js';

describe('error codes', () => {
  const doc = readFileSync(new URL('../docs/errors.md', import.meta.url), 'utf8');

  it.each(Object.keys(ERROR_CODES))('%s is documented in docs/errors.md', (code) => {
    expect(doc).toContain(`\`${code}\``);
  });

  /** The HTTP column of each code's row in docs/errors.md ("| `GW_ERR_…` | 404 | meaning | what to do |"). */
  const documentedStatus = new Map([...doc.matchAll(/^\| `(GW_ERR_[A-Z0-9_]+)` \| (\d{3}) \|/gm)].map((m) => [m[1]!, Number(m[2])]));

  it.each(Object.keys(ERROR_CODES))('%s has its HTTP status in docs/errors.md, the same as the registry', (code) => {
    expect(documentedStatus.get(code)).toBe(httpStatus(code as ErrorCode));
  });

  it('every code has an HTTP error status (4xx or 5xx)', () => {
    for (const [code, spec] of Object.entries(ERROR_CODES)) expect(spec.status, code).toBeGreaterThanOrEqual(400);
    for (const [code, spec] of Object.entries(ERROR_CODES)) expect(spec.status, code).toBeLessThan(600);
  });

  it('docs/errors.md lists no code the gateway does not have', () => {
    const documented = [...doc.matchAll(/`(GW_ERR_[A-Z0-9_]+)`/g)].map((m) => m[1]);
    for (const code of documented) expect(Object.keys(ERROR_CODES)).toContain(code);
  });

  it('codes follow GW_ERR_<AREA>_<WHAT> and every one has a summary and a hint', () => {
    for (const [code, spec] of Object.entries(ERROR_CODES)) {
      expect(code).toMatch(/^GW_ERR_[A-Z0-9]+(_[A-Z0-9]+)*$/);
      expect(spec.summary.length).toBeGreaterThan(10);
      expect(spec.hint.length).toBeGreaterThan(10);
    }
  });

  it('no hint prints a template placeholder ({download_url}) instead of the value a user needs', () => {
    for (const [code, spec] of Object.entries(ERROR_CODES)) expect(spec.hint, code).not.toMatch(/\{[a-z_]+\}/);
  });

  it('wraps foreign errors as internal errors, keeping the cause', () => {
    const cause = new TypeError('boom');
    const e = toGatewayError(cause);
    expect(e).toBeInstanceOf(GatewayError);
    expect(e.code).toBe('GW_ERR_INTERNAL');
    expect(e.cause).toBe(cause);
    expect(e.toJSON()).toEqual({ code: 'GW_ERR_INTERNAL', message: 'boom', hint: ERROR_CODES.GW_ERR_INTERNAL.hint });
  });
});

describe('isErrorCode (a code a peer sent)', () => {
  it('takes the codes this version has, and nothing from the prototype or of another type', () => {
    expect(isErrorCode('GW_ERR_HOST_RENEW_TOO_SOON')).toBe(true);
    for (const code of ['toString', 'constructor', '__proto__', 'hasOwnProperty', 'GW_ERR_FROM_THE_FUTURE', '', 7, null, undefined, {}]) {
      expect(isErrorCode(code), String(code)).toBe(false);
    }
  });
});
