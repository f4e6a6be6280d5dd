//! `cargo run -p outbox-example-blog`, then open http://127.0.0.1:8000.

#[rocket::launch]
fn launch() -> _ {
    let settings = match outbox_example_blog::Settings::from_env() {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2);
        }
    };
    match outbox_example_blog::rocket(settings) {
        Ok(rocket) => rocket,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(1);
        }
    }
}
