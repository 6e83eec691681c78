module bookfleet.test/pause

go 1.22
