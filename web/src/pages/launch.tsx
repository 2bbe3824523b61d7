/**
 * Where an app launch comes back from the app's own host (/x-gateway-auth set a nonce cookie there and sent the
 * browser here with ?app=&addr=&state=): the page asks, with this session, for a launch token bound to that nonce
 * and goes on to the app's host, which redeems it only in the browser that holds the nonce.
 */
import { useEffect, useState } from 'preact/hooks';
import { api } from '../api.js';
import { ErrorBox, Spinner } from '../components/ui.js';
import type { ApiError } from '../lib/errors.js';
import { launchParams, launchUrlFits } from '../lib/route.js';

export function LaunchPage() {
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  const [params] = useState(() => launchParams(location.search));
  useEffect(() => {
    if (!params) return setError(new Error('This launch address is incomplete: open the app from the resources page.'));
    let live = true;
    api.launchApp(params.app, params.state, params.addr).then(
      ({ url }) => {
        if (!live) return;
        if (!launchUrlFits(url, params.addr)) return setError(new Error(`the Proxy answered a launch address that is not the app's: ${url.slice(0, 100)}`));
        // replace: going back does not start the launch again with a spent token.
        window.location.replace(url);
      },
      (e: Error) => live && setError(e),
    );
    return () => {
      live = false;
    };
  }, [params]);
  return (
    <div class="card narrow" data-testid="app-launch">
      {error ? (
        <>
          <h1>The app did not open</h1>
          <ErrorBox error={error} testid="app-launch-error" />
          <a class="btn" href="/web/">Back to the resources</a>
        </>
      ) : (
        <Spinner label={`Opening ${params?.app ?? 'the app'}…`} />
      )}
    </div>
  );
}
