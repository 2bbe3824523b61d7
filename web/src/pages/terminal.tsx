/**
 * A shell on a server in the browser: xterm.js over the Proxy's terminal WebSocket (binary frames are the
 * terminal's bytes both ways; text frames are JSON control messages), resized with the fit addon.
 */
import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import '@xterm/xterm/css/xterm.css';
import { useEffect, useRef, useState } from 'preact/hooks';
import { api, bearer } from '../api.js';
import { Badge, ErrorBox } from '../components/ui.js';
import { ApiError } from '../lib/errors.js';
import { exitLine, openableLink, parseServerMessage, resizeMessage, subprotocols, terminalUrl } from '../lib/terminal.js';
import { navigate } from '../nav.js';
import type { CurrentSession } from '../types.js';
import { defineXtermStyle } from '../xterm-style.js';

type Status = 'connecting' | 'connected' | 'closed';

const THEME = { background: '#0f1720', foreground: '#e6edf3', cursor: '#7dd3fc', selectionBackground: '#264f78' };

function openSocket(term: Terminal, node: string, login: string, setStatus: (s: Status) => void, setError: (e: ApiError | undefined) => void): WebSocket {
  const token = bearer.get() ?? '';
  const ws = new WebSocket(terminalUrl(location, node, login, term.cols, term.rows), subprotocols(token));
  ws.binaryType = 'arraybuffer';
  let ended = false;
  let opened = false;
  ws.onopen = () => {
    opened = true;
    setStatus('connected');
    ws.send(resizeMessage(term.cols, term.rows));
    term.focus();
  };
  ws.onmessage = (ev: MessageEvent) => {
    if (ev.data instanceof ArrayBuffer) {
      term.write(new Uint8Array(ev.data));
      return;
    }
    const m = parseServerMessage(String(ev.data));
    if (m.type === 'error') {
      ended = true;
      setError(new ApiError({ status: 0, code: m.code, message: m.message, hint: m.hint }));
      term.write(`\r\n\x1b[31m[error: ${m.message}${m.code ? ` (${m.code})` : ''}]\x1b[0m\r\n`);
    } else if (m.type === 'exit') {
      ended = true;
      term.write(`\r\n\x1b[2m${exitLine(m)}\x1b[0m\r\n`);
    }
  };
  ws.onclose = (ev: CloseEvent) => {
    setStatus('closed');
    // Refused before it opened: the browser does not say why. If the session has ended, asking for it sends the
    // page to the sign-in page with the reason (api.ts); otherwise the message below stands.
    if (!opened) void api.current().catch(() => undefined);
    if (!ended) {
      const why = ev.reason || (ev.code === 1006 ? 'the connection to the Proxy was lost or refused' : `closed (${ev.code})`);
      term.write(`\r\n\x1b[2m[disconnected: ${why}]\x1b[0m\r\n`);
      if (ev.code !== 1000) setError(new ApiError({ status: 0, code: '', message: `The terminal connection ended: ${why}`, hint: 'Reconnect; if it keeps failing, check that your session is still valid and that the server is online.' }));
    }
  };
  return ws;
}

/**
 * Hyperlinks a program prints (OSC 8) open only when they are http(s), in a new tab without an opener: a server's
 * output must never make the page navigate to javascript:, data: or another scheme.
 */
const LINKS = {
  allowNonHttpProtocols: false,
  activate(_event: MouseEvent, uri: string): void {
    if (openableLink(uri)) window.open(uri, '_blank', 'noopener,noreferrer');
  },
};

export function TerminalPage({ node, session }: { node: string; session: CurrentSession }) {
  const login = new URLSearchParams(location.search).get('login') || session.user.logins[0] || '';
  const host = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState<Status>('connecting');
  const [error, setError] = useState<ApiError | undefined>(undefined);
  const [attempt, setAttempt] = useState(0);

  useEffect(() => {
    if (!host.current || !login) return;
    defineXtermStyle();
    const term = new Terminal({ cursorBlink: true, fontSize: 14, lineHeight: 1.2, fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace', theme: THEME, scrollback: 5000, linkHandler: LINKS });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(host.current);
    fit.fit();
    setStatus('connecting');
    setError(undefined);
    const ws = openSocket(term, node, login, setStatus, setError);
    const input = term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(new TextEncoder().encode(d)));
    const binary = term.onBinary((d) => ws.readyState === WebSocket.OPEN && ws.send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
    const resized = term.onResize(({ cols, rows }) => ws.readyState === WebSocket.OPEN && ws.send(resizeMessage(cols, rows)));
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(host.current);
    return () => {
      observer.disconnect();
      input.dispose();
      binary.dispose();
      resized.dispose();
      ws.close(1000, 'terminal closed');
      term.dispose();
    };
  }, [node, login, attempt]);

  return (
    <div class="terminal-page">
      <div class="terminal-bar">
        <button type="button" class="btn btn-ghost btn-small" onClick={() => navigate('/web/')} data-testid="terminal-back">← Resources</button>
        <span class="terminal-title mono" data-testid="terminal-title">{login}@{node}</span>
        <span data-testid="terminal-status" data-status={status}>
          {status === 'connected' ? <Badge kind="ok">connected</Badge> : status === 'connecting' ? <Badge kind="info">connecting…</Badge> : <Badge kind="bad">disconnected</Badge>}
        </span>
        <span class="spacer" />
        {status === 'closed' ? <button type="button" class="btn btn-small" onClick={() => setAttempt((a) => a + 1)} data-testid="terminal-reconnect">Reconnect</button> : null}
      </div>
      {!login ? <ErrorBox error={new Error('Your roles give you no login on servers, so no terminal can be opened.')} testid="terminal-error" /> : null}
      <ErrorBox error={error} testid="terminal-error" />
      <div class="terminal-host" ref={host} data-testid="terminal" />
    </div>
  );
}
