/** The terminal's WebSocket protocol (the contract's): pure parts, tested without a browser. */

export const SUBPROTOCOL = 'gateway-terminal';
/** Terminal sizes are clamped to this (the server caps them too). */
export const MAX_COLS = 1000;
export const MAX_ROWS = 500;
/** A text frame longer than this from the server is not parsed. */
const MAX_CONTROL = 64 * 1024;

export type ServerMessage =
  | { type: 'error'; code: string; message: string; hint: string }
  | { type: 'exit'; code: number | undefined; signal: string | undefined; message: string }
  | { type: 'other'; text: string };

export function clampSize(cols: number, rows: number): { cols: number; rows: number } {
  const c = (n: number, max: number) => (Number.isFinite(n) ? Math.min(max, Math.max(1, Math.floor(n))) : 80);
  return { cols: c(cols, MAX_COLS), rows: rows === 0 || !Number.isFinite(rows) ? 24 : c(rows, MAX_ROWS) };
}

/** The URL of the WebSocket for a node and login, on the page's own host. */
export function terminalUrl(location: { protocol: string; host: string }, node: string, login: string, cols: number, rows: number): string {
  const size = clampSize(cols, rows);
  const q = new URLSearchParams({ node, login, cols: String(size.cols), rows: String(size.rows) });
  return `${location.protocol === 'http:' ? 'ws' : 'wss'}://${location.host}/webapi/terminal?${q}`;
}

/** The subprotocol list: ours, then the bearer (a browser cannot set headers on a WebSocket). */
export function subprotocols(bearer: string): string[] {
  // A subprotocol is an HTTP token: base64url is one, anything else would make the browser throw.
  if (!/^[A-Za-z0-9_-]{1,512}$/.test(bearer)) throw new RangeError('the session bearer is not base64url');
  return [SUBPROTOCOL, `bearer.${bearer}`];
}

export function resizeMessage(cols: number, rows: number): string {
  return JSON.stringify({ type: 'resize', ...clampSize(cols, rows) });
}

const str = (v: unknown): string => (typeof v === 'string' ? v.slice(0, 4096) : '');

/** A text frame from the server. Unknown or malformed ones are 'other' (shown, never executed). */
export function parseServerMessage(text: string): ServerMessage {
  if (text.length > MAX_CONTROL) return { type: 'other', text: `${text.slice(0, 200)}…` };
  let m: Record<string, unknown>;
  try {
    const parsed = JSON.parse(text) as unknown;
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return { type: 'other', text: text.slice(0, 200) };
    m = parsed as Record<string, unknown>;
  } catch {
    return { type: 'other', text: text.slice(0, 200) };
  }
  if (m.type === 'error') return { type: 'error', code: str(m.code), message: str(m.message) || 'the terminal failed', hint: str(m.hint) };
  if (m.type === 'exit') {
    const code = typeof m.code === 'number' && Number.isInteger(m.code) ? m.code : typeof m.status === 'number' ? m.status : undefined;
    const signal = str(m.signal) || undefined;
    return { type: 'exit', code, signal, message: str(m.message) };
  }
  return { type: 'other', text: text.slice(0, 200) };
}

/** The line printed in the terminal when the session ends. */
export function exitLine(m: Extract<ServerMessage, { type: 'exit' }>): string {
  const how = m.signal ? `killed by signal ${m.signal}` : m.code === undefined ? 'ended' : `exited with status ${m.code}`;
  return `[session ${how}${m.message ? `: ${m.message}` : ''}]`;
}

/** Whether a hyperlink a program printed in the terminal (OSC 8) may be opened: http(s) only. */
export function openableLink(uri: string): boolean {
  return /^https?:\/\/[^\s]/i.test(uri) && uri.length <= 2048;
}
