/** Navigation inside the page: history.pushState and one listener (the app re-renders on every change). */

type Listener = () => void;
const listeners = new Set<Listener>();

export function onNavigate(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

export function navigate(to: string, options: { replace?: boolean } = {}): void {
  if (options.replace) history.replaceState(null, '', to);
  else history.pushState(null, '', to);
  for (const l of listeners) l();
}

window.addEventListener('popstate', () => {
  for (const l of listeners) l();
});

/** The sign-in page's address for going back to `from` afterwards. */
export function loginHref(from: string, reason?: 'expired' | 'signed-out'): string {
  const q = new URLSearchParams();
  if (from && !from.startsWith('/web/login')) q.set('redirect', from);
  if (reason === 'expired') q.set('expired', '1');
  const s = q.toString();
  return `/web/login${s ? `?${s}` : ''}`;
}

/** A click on an in-page link: navigate without a reload (modifier keys and other targets keep the browser's way). */
export function linkClick(e: MouseEvent): void {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = (e.target as Element | null)?.closest?.('a');
  if (!a || a.target || a.origin !== location.origin || !a.pathname.startsWith('/web/')) return;
  e.preventDefault();
  navigate(a.pathname + a.search);
}
